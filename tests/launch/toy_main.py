"""Per-rank programs for launch tests (importable by spawned processes)."""

import json
import os

from lazytrain.utils import comm


def record_ranks(cfg):
    """Write this rank's view of the process group and a gathered value into the output dir."""
    import torch

    values = comm.all_gather(comm.get_rank() * 10)
    gathered = comm.gather(comm.get_rank() + 1)
    reduced = comm.reduce_dict({"x": torch.tensor(float(comm.get_rank()))})
    out = os.path.join(cfg.train.output_dir, f"rank{comm.get_rank()}.json")
    os.makedirs(cfg.train.output_dir, exist_ok=True)
    with open(out, "w") as f:
        json.dump(
            {
                "rank": comm.get_rank(),
                "world_size": comm.get_world_size(),
                "gathered": values,
                "seed": comm.shared_random_seed(),
                "lr": cfg.train.lr,
                "gather": gathered,
                "reduced": reduced["x"].item() if comm.is_main_process() else None,
                "local_rank": comm.get_local_rank(),
                "local_size": comm.get_local_size(),
            },
            f,
        )
    if comm.is_main_process():
        with open(os.path.join(cfg.train.output_dir, "metrics.json"), "w") as f:
            f.write(json.dumps({"iteration": 0, "bbox/AP": float(cfg.train.lr) * 100}) + "\n")
    return {"bbox": {"AP": float(cfg.train.lr)}}


def fail_on_rank_one(cfg):
    os.makedirs(cfg.train.output_dir, exist_ok=True)
    with open(os.path.join(cfg.train.output_dir, f"pid{comm.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    comm.synchronize()
    if comm.get_rank() == 1:
        raise RuntimeError("deliberate failure on rank 1")
    comm.synchronize()  # rank 0 would wait here forever if the failure were not propagated


def fail_if_lr_is_negative(cfg):
    """Record ranks, then fail the job when train.lr < 0 (a failing job inside a sweep)."""
    if cfg.train.lr < 0:
        raise ValueError(f"negative lr {cfg.train.lr}")
    return record_ranks(cfg)
