"""The default programs: `default_setup`, `do_train`, `do_test` and `run`, as plain functions.

They read the detectron2 lazy-config keys: ``model``, ``optimizer`` (its ``params`` node is built from the
model), ``lr_multiplier``, ``dataloader.{train,test,evaluator}`` and ``train`` (run settings,
``train.trainer`` and the named hook mapping ``train.hooks``). Each shared object (model, optimizer, train
loader, checkpointer) is built exactly once and handed to the trainer; hooks reach them via the trainer.
To customise more than the config allows, copy `do_train` into your own module and point
``launch.main`` at it.
"""

from __future__ import annotations

import functools
import logging
import os
import random
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import LazyConfig, instantiate
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.hooks import flatten_results
from lazytrain.utils import comm
from lazytrain.utils.env import collect_env_info
from lazytrain.utils.logger import setup_logger

__all__ = ["INJECTED_ARGUMENTS", "build_model", "default_setup", "do_test", "do_train", "run", "seed_all_rng"]

logger = logging.getLogger(__name__)

# Arguments the program passes at instantiation time (validation must not report them missing).
INJECTED_ARGUMENTS = {
    "train.trainer": ("model", "data_loader", "optimizer"),
    "optimizer": ("params",),
    "optimizer.params": ("model",),
}


def seed_all_rng(seed: int) -> None:
    """Seed python, numpy and torch RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_setup(cfg: DictConfig) -> None:
    """Logging for this rank, environment info, config dump to ``output_dir/config.yaml``, seeding.

    Seeds ``train.seed + rank``; a negative ``train.seed`` draws one random seed shared by all ranks.
    """
    output_dir = cfg.train.output_dir
    rank = comm.get_rank()
    if comm.is_main_process() and output_dir:
        os.makedirs(output_dir, exist_ok=True)
    setup_logger(output_dir or None, distributed_rank=rank)
    logger.info("Rank %d of world size %d", rank, comm.get_world_size())
    logger.info("Environment:\n%s", collect_env_info())
    logger.info("Full config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))
    if comm.is_main_process() and output_dir:
        path = os.path.join(output_dir, "config.yaml")
        saved = cfg.copy()
        # Fed back as CONFIG, the saved file must write to its new run's directory, not over this one.
        saved.train.output_dir = "./output"
        LazyConfig.save(saved, path)
        logger.info("Config saved to %s", path)
    seed = int(cfg.train.get("seed", 0))
    if seed < 0:
        seed = comm.shared_random_seed()
    seed_all_rng(seed + rank)


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """Instantiate ``cfg.model`` and move it to ``train.device``."""
    model = instantiate(cfg.model)
    device = cfg.train.get("device", "cpu")
    if device == "cuda":
        device = f"cuda:{comm.get_local_rank()}"
    return model.to(device)


def _wrap_ddp(cfg: DictConfig, model: torch.nn.Module) -> torch.nn.Module:
    if comm.get_world_size() == 1:
        return model
    ddp = cfg.train.get("ddp", {})
    device_ids = [comm.get_local_rank()] if next(model.parameters()).is_cuda else None
    return torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=device_ids,
        find_unused_parameters=ddp.get("find_unused_parameters", False),
        broadcast_buffers=ddp.get("broadcast_buffers", False),
        gradient_as_bucket_view=ddp.get("gradient_as_bucket_view", True),
    )


def _write_eval_metrics(cfg: DictConfig, results: dict, iteration: int) -> None:
    """Append eval results to metrics.json for eval-only runs (training runs write via the writer hook)."""
    if not (comm.is_main_process() and cfg.train.output_dir and results):
        return
    import json

    with open(os.path.join(cfg.train.output_dir, "metrics.json"), "a") as f:
        f.write(json.dumps({"iteration": iteration, **flatten_results(results)}, sort_keys=True) + "\n")


def do_test(cfg: DictConfig, model: torch.nn.Module) -> dict:
    """Evaluate `model` on ``dataloader.test`` with ``dataloader.evaluator``; returns nested results."""
    if "evaluator" not in cfg.dataloader or "test" not in cfg.dataloader:
        logger.warning("No dataloader.test / dataloader.evaluator in the config: nothing to evaluate.")
        return {}
    from lazytrain.evaluation.evaluator import inference_on_dataset

    # The test loader is built first: it may generate the data set the evaluator reads on first use.
    loader = instantiate(cfg.dataloader.test)
    evaluator = instantiate(cfg.dataloader.evaluator)
    results = inference_on_dataset(model, loader, evaluator)
    return results


def _build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = cfg.optimizer.get("params")
    if OmegaConf.is_dict(params) and "_target_" in params:
        params = instantiate(params, model=model)
    elif params is None:
        params = model.parameters()
    return instantiate(cfg.optimizer, params=params)


def do_train(cfg: DictConfig) -> dict:
    """Build everything once, resume or load initial weights, and train. Returns the last eval results."""
    # Model: on its device and wrapped in DDP before the optimizer and trainer see it.
    model = build_model(cfg)
    logger.info("Model:\n%s", model)
    model = _wrap_ddp(cfg, model)
    optimizer = _build_optimizer(cfg, comm_unwrap(model))
    train_loader = instantiate(cfg.dataloader.train)

    # Trainer and hooks from the config; shared objects are injected, never built twice.
    trainer = instantiate(cfg.train.trainer, model=model, data_loader=train_loader, optimizer=optimizer)
    trainer.checkpointer = Checkpointer(
        model,
        cfg.train.output_dir,
        allow_unsafe=cfg.train.get("allow_unsafe_checkpoint", False),
        optimizer=optimizer,
        trainer=trainer,
    )
    trainer.test_function = functools.partial(do_test, cfg, model)
    trainer.last_eval_results = {}
    hooks = instantiate(cfg.train.hooks) if cfg.train.get("hooks") else {}
    trainer.register_hooks(hooks)

    # Resume (everything, incl. data position and RNG) or start from train.init_checkpoint (weights).
    start_iter = 0
    if cfg.train.get("resume", False) and trainer.checkpointer.has_checkpoint():
        extra = trainer.checkpointer.load(trainer.checkpointer.get_checkpoint_file())
        start_iter = extra.get("iteration", -1) + 1
        logger.info("Resuming from iteration %d", start_iter)
    else:
        if cfg.train.get("resume", False):
            logger.warning(
                "train.resume=true but %s has no last_checkpoint: starting from scratch.",
                cfg.train.output_dir,
            )
        if cfg.train.get("init_checkpoint"):
            load_init_checkpoint(cfg, model)
    trainer.train(start_iter, cfg.train.max_iter)
    return trainer.last_eval_results


def comm_unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def load_init_checkpoint(cfg: DictConfig, model: torch.nn.Module) -> None:
    """Load ``train.init_checkpoint`` weights into `model` (lazytrain checkpoints or bare state dicts)."""
    path = cfg.train.init_checkpoint
    try:
        from lazytrain.modeling.weights import load_init_weights
    except ImportError:
        Checkpointer(model, allow_unsafe=cfg.train.get("allow_unsafe_checkpoint", False)).load(
            path, checkpointables=[]
        )
        return
    load_init_weights(comm_unwrap(model), path)


def run(cfg: DictConfig) -> dict[str, Any]:
    """The per-rank program: setup, then evaluation only (``train.eval_only``) or training."""
    default_setup(cfg)
    if cfg.train.get("eval_only", False):
        model = build_model(cfg)
        if cfg.train.get("init_checkpoint"):
            load_init_checkpoint(cfg, model)
        results = do_test(cfg, model)
        _write_eval_metrics(cfg, results, iteration=0)
        return results
    return do_train(cfg)
