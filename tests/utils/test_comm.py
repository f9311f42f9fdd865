"""`lazytrain.utils.comm` without a process group, with a 1-process group, and across 2 CPU processes."""

import json
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from lazytrain.launch.launch import find_free_port, launch
from lazytrain.utils import comm


def test_single_process_without_a_group():
    assert not comm.is_initialized()
    assert (comm.get_rank(), comm.get_world_size()) == (0, 1)
    assert (comm.get_local_rank(), comm.get_local_size()) == (0, 1)
    assert comm.is_main_process() and comm.get_local_process_group() is None
    comm.synchronize()
    assert comm.all_gather({"a": 1}) == [{"a": 1}]
    assert comm.gather("x") == ["x"]
    assert isinstance(comm.shared_random_seed(), int)
    losses = {"loss": torch.tensor(2.0)}
    assert comm.reduce_dict(losses) is losses
    assert comm.reduce_dict({}) == {}


def test_groups_are_recreated_for_back_to_back_jobs(tmp_path):
    # What multirun does in one process: bring a group up, use it, destroy it, and again.
    for job in range(2):
        dist.init_process_group(
            "gloo",
            init_method=f"file://{tmp_path}/store{job}",
            rank=0,
            world_size=1,
            timeout=timedelta(seconds=30),
        )
        try:
            comm.create_local_process_group(1)
            assert comm.get_local_rank() == 0 and comm.get_local_size() == 1
            assert comm.all_gather(job) == [job]
            reduced = comm.reduce_dict({"b": torch.tensor(3.0), "a": torch.tensor(1.0)})
            assert {k: v.item() for k, v in reduced.items()} == {"a": 1.0, "b": 3.0}
        finally:
            dist.destroy_process_group()
            comm.reset_process_groups()
        assert comm.get_local_process_group() is None and comm.get_local_rank() == 0


def _record_comm(output_dir: str) -> None:
    torch.set_num_threads(1)
    rank = comm.get_rank()
    reduced = comm.reduce_dict({"x": torch.tensor(float(rank)), "y": torch.tensor(2.0)})
    summed = comm.reduce_dict({"x": torch.tensor(float(rank + 1))}, average=False)
    comm.synchronize()
    record = {
        "rank": rank,
        "world_size": comm.get_world_size(),
        "local": [comm.get_local_rank(), comm.get_local_size()],
        "main": comm.is_main_process(),
        "all_gather": comm.all_gather({"rank": rank, "name": f"r{rank}"}),
        "gather": comm.gather(rank * 2),
        "gather_to_1": comm.gather(rank, dst=1),
        "seed": comm.shared_random_seed(),
        "reduced": {k: v.item() for k, v in reduced.items()} if rank == 0 else None,
        "summed": summed["x"].item() if rank == 0 else None,
        "group": comm.get_local_process_group() is not None,
    }
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def test_two_cpu_processes_agree(tmp_path):
    url = f"tcp://127.0.0.1:{find_free_port()}"
    assert launch(_record_comm, 2, dist_url=url, args=(str(tmp_path),), backend="gloo", use_gpu=False) is None
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rank"], r1["rank"], r0["world_size"], r1["world_size"]) == (0, 1, 2, 2)
    assert r0["local"] == [0, 2] and r1["local"] == [1, 2] and r0["group"] and r1["group"]
    assert r0["main"] and not r1["main"]
    expected = [{"rank": 0, "name": "r0"}, {"rank": 1, "name": "r1"}]
    assert r0["all_gather"] == r1["all_gather"] == expected
    assert r0["gather"] == [0, 2] and r1["gather"] == []
    assert r0["gather_to_1"] == [] and r1["gather_to_1"] == [0, 1]
    assert r0["seed"] == r1["seed"]
    assert r0["reduced"] == {"x": 0.5, "y": 2.0} and r0["summed"] == 3.0


def test_launch_runs_world_size_one_in_process():
    assert launch(comm.get_world_size, 1) == 1
    assert launch(sorted, 1, args=([3, 1, 2],)) == [1, 2, 3]


def test_auto_dist_url_needs_one_machine():
    with pytest.raises(ValueError, match="dist_url='auto' works on one machine only"):
        launch(comm.get_rank, 1, num_machines=2, dist_url="auto")
