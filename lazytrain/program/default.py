"""The default programs: `default_setup`, `do_train`, `do_test` and `run`, as plain functions.

They read the detectron2 lazy-config keys: ``model``, ``optimizer`` (its ``params`` node is built from the
model), ``lr_multiplier``, ``dataloader.{train,test,evaluator}`` and ``train`` (run settings,
``train.trainer`` and the named hook mapping ``train.hooks``).

How the pieces meet: the program builds each shared object exactly once, in this order: model (moved to
``train.device``, wrapped in DDP when the world size is > 1), optimizer, train loader. It then calls
``instantiate(cfg.train.trainer, model=..., data_loader=..., optimizer=...)`` (the program injects these three
arguments; see `INJECTED_ARGUMENTS`), builds the `Checkpointer` (which holds the trainer, so the trainer state
is checkpointed) and attaches it and the evaluation function to the trainer, then instantiates
``train.hooks`` and registers them in mapping order. Hooks reach the shared objects through ``self.trainer``;
their configs hold only plain values and interpolations, so they save to YAML and take overrides.

To customise more than the config allows, copy `do_train` into your own module and point ``launch.main`` at
a function calling it.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import shutil
import time
import warnings
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import LazyConfig, instantiate, tree
from lazytrain.config.versioning import find_meaning_changes, read_version
from lazytrain.data.training_extent import get_training_extent
from lazytrain.engine import HookBase
from lazytrain.engine.checkpoint import Checkpointer
from lazytrain.engine.ema import EMAHook, ModelEMA
from lazytrain.engine.hooks.evaluation import flatten_results
from lazytrain.engine.plot_writer import write_run_plots
from lazytrain.program.batch_size import scale_learning_rate
from lazytrain.program.run_report import log_eval_header, log_eval_summary, log_run_header, log_run_summary
from lazytrain.utils import comm
from lazytrain.utils.env import collect_env_info
from lazytrain.utils.events import EventStorage, JSONWriter
from lazytrain.utils.logger import setup_logger

__all__ = [
    "INJECTED_ARGUMENTS",
    "build_model",
    "build_model_ema",
    "check_num_classes",
    "compile_backbone",
    "default_setup",
    "do_test",
    "do_train",
    "get_resume_file",
    "load_init_checkpoint",
    "run",
    "seed_all_rng",
    "set_backend_flags",
]

logger = logging.getLogger(__name__)

# Arguments the program passes at instantiation time (config validation must not report them missing).
INJECTED_ARGUMENTS = {
    "train.trainer": ("model", "data_loader", "optimizer"),
    "optimizer": ("params",),
    "optimizer.params": ("model",),
}


def seed_all_rng(seed: int) -> None:
    """Seed the python, numpy and torch (CPU and CUDA) random number generators with `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_setup(cfg: DictConfig) -> None:
    """Prepare this rank: logging, environment info, config dump to ``output_dir/config.yaml``, seeding, the
    torch backend settings (`set_backend_flags`).

    A resumed run (``train.resume``) over an existing ``config.yaml`` leaves it: `do_train` replaces it after
    the first step, so that a resume that fails before leaves the run's record as it was.

    Each rank seeds ``train.seed + rank``; a negative ``train.seed`` draws one random seed on rank 0, shared
    by all ranks (then also offset by the rank).

    Args:
        cfg: the whole config (reads ``train.output_dir`` and ``train.seed``).
    """
    output_dir = cfg.train.output_dir
    rank = comm.get_rank()
    if comm.is_main_process() and output_dir:
        os.makedirs(output_dir, exist_ok=True)
    # The console gets a short header (run_report); these long dumps go to log.txt unless train.verbose.
    verbose = bool(cfg.train.get("verbose", False))
    setup_logger(
        output_dir or None, distributed_rank=rank, console_level=logging.DEBUG if verbose else logging.INFO
    )
    logger.debug("Rank %d of world size %d", rank, comm.get_world_size())
    logger.debug("Environment:\n%s", collect_env_info())
    logger.debug("Full config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))

    if comm.is_main_process() and output_dir:
        path = os.path.join(output_dir, "config.yaml")
        if cfg.train.get("resume", False) and os.path.isfile(path):
            # config.yaml describes what trained: a resumed run replaces it at its first step (do_train).
            logger.debug("Resuming over %s: it is replaced once the resumed run has trained a step.", path)
        else:
            LazyConfig.save(_get_saved_config(cfg), path)
            logger.debug("Config saved to %s", path)

    seed = int(cfg.train.get("seed", 0))
    if seed < 0:
        seed = comm.shared_random_seed()
    seed_all_rng(seed + rank)
    logger.debug("Seeded the random number generators with %d (train.seed + rank)", seed + rank)
    set_backend_flags(cfg)


def set_backend_flags(cfg: DictConfig) -> None:
    """``train.cudnn_benchmark`` (detectron2's key; default false) into ``torch.backends.cudnn.benchmark`` and
    ``train.float32_matmul_precision`` (default "highest", torch's) into ``torch.set_float32_matmul_precision``.
    Either may change float32 results: cuDNN's algorithms round differently, and "high" is TF32."""
    benchmark = bool(cfg.train.get("cudnn_benchmark", False))
    precision = str(cfg.train.get("float32_matmul_precision", "highest"))
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision)
    logger.debug("cudnn.benchmark=%s, float32 matmul precision %s", benchmark, precision)


def _get_saved_config(cfg: DictConfig) -> DictConfig:
    """What ``config.yaml`` holds: `cfg` with ``train.output_dir`` ``./output``. Fed back as CONFIG, the saved
    file must write to its new run's directory, not over this one: paths that were resolved from
    ``train.output_dir`` (evaluator, writer hook, ...) point at it again."""
    saved = cfg.copy()
    _point_at_output_dir(saved, str(cfg.train.output_dir))
    saved.train.output_dir = "./output"
    return saved


def _point_at_output_dir(cfg: DictConfig, output_dir: str) -> None:
    """Replace, in place, every string equal to `output_dir` or under it by ``${train.output_dir}[/rest]``."""
    for entry in tree.walk(cfg):
        value = tree.raw_value(entry.node)
        if tree.has_children(entry.node) or not isinstance(value, str):
            continue
        if value == output_dir or value.startswith(output_dir.rstrip("/") + "/"):
            entry.parent[entry.key] = "${train.output_dir}" + value[len(output_dir) :]


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """Instantiate ``cfg.model`` and move it to ``train.device`` (``cuda`` means this rank's local GPU)."""
    model = instantiate(cfg.model)
    device = cfg.train.get("device", "cpu")
    if device == "cuda":
        # The GPU `launch` chose for this rank (cuda:{local rank}, or cuda:0 for a process bound to one GPU).
        device = f"cuda:{torch.cuda.current_device()}"
    return model.to(device)


def compile_backbone(cfg: DictConfig, model: torch.nn.Module) -> None:
    """``train.compile.enabled``: the model's backbone through ``torch.compile`` for training
    (`lazytrain.modeling.RCNN.compile_backbone`, with ``train.compile.mode`` and ``backend``)."""
    options = cfg.train.get("compile") or {}
    if not options.get("enabled", False):
        return
    if not hasattr(model, "compile_backbone"):
        raise TypeError(
            f"train.compile.enabled=true compiles the model's backbone, but the model ({type(model).__name__}) "
            "has no compile_backbone(mode=, backend=) method (lazytrain.modeling.RCNN has one). Set "
            "train.compile.enabled=false, or compile inside your model."
        )
    mode, backend = options.get("mode"), options.get("backend", "inductor")
    model.compile_backbone(mode=mode, backend=backend)
    logger.info("train.compile: the backbone runs through torch.compile (mode %s, backend %s)", mode, backend)


# DDP compares a gradient's strides with its bucket's strictly, in dimensions of size 1 too, where strides mean
# nothing: a 1x1 convolution's weight gradient with strides [C, 1, C, C] has the memory layout of its bucket's
# [C, 1, 1, 1], and the warning every rank printed at its first step was spurious. Other stride mismatches stay.
_SPURIOUS_GRAD_STRIDES = (
    r"Grad strides do not match bucket view strides[\s\S]*"
    r"grad\.sizes\(\) = \[\d+, (\d+), 1, 1\], strides\(\) = \[\1, 1, \1, \1\]\s*"
    r"bucket_view\.sizes\(\) = \[\d+, \1, 1, 1\], strides\(\) = \[\1, 1, 1, 1\]"
)


def _wrap_ddp(cfg: DictConfig, model: torch.nn.Module) -> torch.nn.Module:
    if comm.get_world_size() == 1:
        return model
    warnings.filterwarnings("ignore", _SPURIOUS_GRAD_STRIDES, UserWarning)
    ddp = cfg.train.get("ddp", {})
    device_ids = [next(model.parameters()).device.index] if next(model.parameters()).is_cuda else None
    with warnings.catch_warnings():
        # torch >= 2.14 deprecates broadcast_buffers but says to keep using broadcast_buffers=False (rank-local
        # BN statistics, detectron2's default) until its replacement exists; the warning would only be noise.
        warnings.filterwarnings(
            "ignore", message=".*broadcast_buffers.*is deprecated", category=FutureWarning
        )
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            find_unused_parameters=ddp.get("find_unused_parameters", False),
            broadcast_buffers=ddp.get("broadcast_buffers", False),
            gradient_as_bucket_view=ddp.get("gradient_as_bucket_view", True),
        )


class _ResumedConfigSaver(HookBase):
    """Saves a resumed run's config as ``config.yaml`` (rank 0) after the first step, before any other hook
    (a checkpoint of that step, a tracker logging the config as params) runs.

    The invariant: ``config.yaml`` describes what trained. A resume that fails before (a value refused while
    the data, model or optimizer are built, a checkpoint that does not load, a first step that fails on any
    rank: the step's agreement is a collective) leaves the run folder's config files as they were, so that a
    plain ``train.resume=true`` continues the run again; a process killed before the write leaves them too,
    beside the previous checkpoint. A resume with nothing left to train leaves them as they were.
    """

    def __init__(self, path: str, saved: DictConfig) -> None:
        self.path, self.saved = path, saved

    def after_step(self) -> None:
        if self.saved is not None:
            if _keep_config_of_resumed_run(self.path, self.saved):
                LazyConfig.save(self.saved, self.path)
                logger.debug("Config saved to %s", self.path)
            self.saved = None


def _keep_config_of_resumed_run(path: str, saved: DictConfig) -> bool:
    """A resumed run whose config differs from the one it was started with says which values changed (a
    changed ``train.max_iter`` changes the schedule from here on) and keeps the earlier file beside the new one,
    so that ``config.yaml`` never silently stops describing the iterations already trained. So does a run
    started by an older lazytrain whose config sets an argument that has changed meaning since
    (`lazytrain.config.versioning.MEANING_CHANGES`), even with the same values.

    Returns whether `saved` is to replace ``config.yaml`` (the earlier file is then kept as
    ``config.before_resume_N.yaml``; ``config.yaml`` stays until it is replaced, so that a process killed in
    between leaves a run folder that resumes)."""
    with open(path, encoding="utf-8") as f:
        version = read_version(f.read())
    earlier = OmegaConf.load(path)
    meanings = find_meaning_changes(earlier, version)
    previous = _flat(OmegaConf.to_container(earlier, resolve=False))
    current = _flat(OmegaConf.to_container(saved, resolve=False))
    changed = [
        f"{key}: {previous.get(key, '(absent)')!r} -> {current.get(key, '(absent)')!r}"
        for key in sorted(previous.keys() | current.keys())
        if key != "train.resume" and previous.get(key) != current.get(key)
    ]
    if not changed and not meanings:
        return False
    number = 1
    while os.path.exists(os.path.join(os.path.dirname(path), f"config.before_resume_{number}.yaml")):
        number += 1
    kept = os.path.join(os.path.dirname(path), f"config.before_resume_{number}.yaml")
    shutil.copyfile(path, kept)
    for meaning in meanings:
        logger.warning(
            "train.resume: the iterations already trained ran under config version %d, and %s. The new meaning "
            "applies from the resumed iteration on; the earlier config is kept as %s.",
            version,
            meaning,
            kept,
        )
    if not changed:
        return True
    shown = "; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")
    logger.warning(
        "train.resume: this run continues with a config that differs from the one it started with (%s). The "
        "new values apply from the resumed iteration on; the earlier config is kept as %s.",
        shown,
        kept,
    )
    return True


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def _build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    # ``optimizer.params`` is a lazy call (e.g. get_default_optimizer_params) completed with the model;
    # without one, all parameters go in one group.
    params = cfg.optimizer.get("params")
    if OmegaConf.is_dict(params) and "_target_" in params:
        params = instantiate(params, model=model)
    elif params is None:
        params = model.parameters()
    return instantiate(cfg.optimizer, params=params)


def build_model_ema(cfg: DictConfig, model: torch.nn.Module) -> ModelEMA | None:
    """A `ModelEMA` of `model` with ``train.ema.decay`` and ``train.ema.tau`` when ``train.ema.enabled``, else
    None (also for configs without ``train.ema``)."""
    settings = cfg.train.get("ema") or {}
    if not settings.get("enabled", False):
        return None
    return ModelEMA(model, decay=settings.get("decay", 0.9998), tau=settings.get("tau", 2000))


def load_init_checkpoint(cfg: DictConfig, model: torch.nn.Module) -> None:
    """Load ``train.init_checkpoint`` weights into `model`, non-strictly (lazytrain checkpoints, torchvision
    detection or ImageNet ResNet files; see `lazytrain.modeling.weights.load_init_weights`)."""
    from lazytrain.modeling.weights import load_init_weights

    load_init_weights(
        comm.unwrap_model(model),
        cfg.train.init_checkpoint,
        allow_unsafe=bool(cfg.train.get("allow_unsafe_checkpoint", False)),
        for_evaluation=bool(cfg.train.get("eval_only", False)),
    )


def do_test(cfg: DictConfig, model: torch.nn.Module) -> dict:
    """Evaluate `model` on ``dataloader.test`` with ``dataloader.evaluator``.

    Returns:
        Nested results ``{task: {metric: float}}`` on the main process, ``{}`` on the others (and when the
        config has no test loader or evaluator).
    """
    if "evaluator" not in cfg.dataloader or "test" not in cfg.dataloader:
        logger.warning("No dataloader.test / dataloader.evaluator in the config: nothing to evaluate.")
        return {}
    from lazytrain.evaluation import inference_on_dataset

    # The test loader is built first: it may generate the data set the evaluator reads on first use.
    loader = instantiate(cfg.dataloader.test)
    evaluator = instantiate(cfg.dataloader.evaluator)
    return inference_on_dataset(model, loader, evaluator)


def do_train(cfg: DictConfig) -> dict:
    """Build everything once, resume or load initial weights, and train.

    ``train.resume=true`` continues from ``output_dir/last_checkpoint`` (weights, optimizer, trainer and hook
    state, data position, RNG states); when there is none, it logs a warning and starts from
    ``train.init_checkpoint`` (or random init), so the same command both starts and resumes a job. A resumed
    run's config replaces ``config.yaml`` after its first step (`_ResumedConfigSaver`).

    ``train.ema.enabled`` adds an EMA of the weights (`lazytrain.engine.ema`: evaluated and saved as the
    checkpoints' ``model``), ``train.images_per_forward`` accumulates gradients (`SimpleTrainer`), and
    ``train.auto_scale_lr`` scales the learning rate to ``dataloader.train.total_batch_size``
    (`lazytrain.program.batch_size`).

    Returns:
        The results of the last evaluation (``{}`` without an eval hook).
    """
    # A resumed run's config replaces config.yaml only once it has trained a step (`_ResumedConfigSaver`).
    config_path = os.path.join(cfg.train.output_dir, "config.yaml") if cfg.train.output_dir else ""
    resumed_config = None
    if comm.is_main_process() and cfg.train.get("resume", False) and os.path.isfile(config_path):
        resumed_config = _ResumedConfigSaver(config_path, _get_saved_config(cfg))

    # Model: on its device and wrapped in DDP before the optimizer and trainer see it.
    model = build_model(cfg)
    logger.debug("Model:\n%s", model)
    compile_backbone(cfg, model)
    model = _wrap_ddp(cfg, model)
    optimizer = _build_optimizer(cfg, comm.unwrap_model(model))
    scale_learning_rate(cfg, optimizer)  # train.auto_scale_lr
    train_loader = instantiate(cfg.dataloader.train)
    fixed_shapes = getattr(comm.unwrap_model(model), "fixed_shapes", None)
    if fixed_shapes is not None:  # model.fixed_shapes' capacities against the data set's most, before step 1
        fixed_shapes.check_data(*get_training_extent(train_loader))
    check_num_classes(cfg, comm.unwrap_model(model))
    _save_categories(cfg)

    # Trainer from the config with the shared objects injected; the checkpointer holds model, optimizer, the
    # EMA of the weights (train.ema) and the trainer itself (iteration, hook states, grad scaler, data position,
    # RNG states).
    trainer = instantiate(cfg.train.trainer, model=model, data_loader=train_loader, optimizer=optimizer)
    trainer.model_ema = build_model_ema(cfg, model)
    trainer.checkpointer = Checkpointer(
        model,
        cfg.train.output_dir,
        allow_unsafe=bool(cfg.train.get("allow_unsafe_checkpoint", False)),
        model_ema=trainer.model_ema,
        optimizer=optimizer,
        trainer=trainer,
    )
    # Evaluation runs the model itself: a DDP forward may broadcast buffers (a collective) in every call, and
    # ranks evaluate different numbers of batches.
    trainer.test_function = functools.partial(do_test, cfg, comm.unwrap_model(model))

    # Hooks: a named mapping in run order; registered before resuming so their states load by name. The EMA
    # is updated first after each step, so that the checkpoint and evaluation hooks see this step's average;
    # before it, a resumed run's config is saved.
    trainer.register_hooks({"resumed_config": resumed_config})
    if trainer.model_ema is not None:
        trainer.register_hooks({"ema": EMAHook()})
    hooks = instantiate(cfg.train.hooks) if cfg.train.get("hooks") else {}
    trainer.register_hooks(hooks)

    start_iter = _resume_or_load_initial_weights(cfg, trainer, model)
    log_run_header(cfg, trainer)
    start = time.perf_counter()
    trainer.train(start_iter, cfg.train.max_iter)
    log_run_summary(cfg, trainer, time.perf_counter() - start)
    return trainer.last_eval_results


def _resume_or_load_initial_weights(cfg: DictConfig, trainer, model: torch.nn.Module) -> int:
    """Resume everything from the last checkpoint, or start from ``train.init_checkpoint`` (weights only);
    returns the iteration to start at."""
    resume = bool(cfg.train.get("resume", False))
    resume_file = get_resume_file(trainer.checkpointer) if resume else ""
    if resume_file:
        extra = trainer.checkpointer.load(resume_file)
        start_iter = extra.get("iteration", -1) + 1
        logger.info("Resuming from iteration %d", start_iter)
        return start_iter
    if resume:
        logger.warning(
            "train.resume=true but %s has no last_checkpoint: starting from scratch%s.",
            cfg.train.output_dir,
            f" with {cfg.train.init_checkpoint}" if cfg.train.get("init_checkpoint") else "",
        )
    if cfg.train.get("init_checkpoint"):
        load_init_checkpoint(cfg, model)
    return 0


def check_num_classes(cfg: DictConfig, model: torch.nn.Module) -> None:
    """Stop before the first step when ``model.num_classes`` is fewer than the train data's categories (the
    first target id past it would stop a step with torch's ``IndexError: Target N is out of bounds``); warn
    once when it is more. The preflight already stopped the counts known before loading
    (`lazytrain.program.preflight.num_classes`). Several train data sets (a list of names, a mixture) share one category list: the
    most categories of any of them count. Reads each data set's ``thing_classes`` (filled when it loaded);
    a data set without them, or a model without ``num_classes``, is not checked.

    Raises:
        ConfigError: naming ``model.num_classes``, the data set, its category count and the value to set.
    """
    from lazytrain.data.catalog import MetadataCatalog
    from lazytrain.errors import ConfigError
    from lazytrain.program.preflight.num_classes import describe_too_few_classes

    num_classes = getattr(model, "num_classes", None)
    names_node = OmegaConf.select(cfg, "dataloader.train.dataset.names")
    if num_classes is None or names_node is None:
        return
    names = instantiate(names_node)  # a name, a list, or registrations returning their names (as when loaded)
    counts = {}
    for name in [names] if isinstance(names, str) else list(names):
        classes = MetadataCatalog.get(name).get("thing_classes") if isinstance(name, str) else None
        if classes is not None:
            counts[name] = len(classes)
    if not counts:
        return
    largest = max(counts, key=counts.get)
    needed = counts[largest]
    if num_classes < needed:
        raise ConfigError(describe_too_few_classes(num_classes, largest, needed))
    if num_classes > needed:
        logger.warning(
            "model.num_classes=%d is more than the %d categories of the train data set '%s': the extra %d "
            "classes are never trained (set model.num_classes=%d unless you add data later).",
            num_classes, needed, largest, num_classes - needed, needed,
        )  # fmt: skip


def _save_categories(cfg: DictConfig) -> None:
    """``output_dir/categories.json``: the class names and json ids of the train data set (now loaded), so
    that predicting with the run (`lazytrain.program.predictor`) does not need the data set."""
    from lazytrain.program.predictor import get_categories, save_categories

    if comm.is_main_process() and cfg.train.output_dir:
        categories = get_categories(cfg, "train")
        if categories is not None:
            save_categories(cfg.train.output_dir, categories)


def get_resume_file(checkpointer: Checkpointer) -> str:
    """The checkpoint every rank resumes from: rank 0 reads ``last_checkpoint`` and decides for all ("" for
    none), so that a lagging shared file system cannot make ranks resume from different iterations.

    Raises:
        ConfigError: on every rank, when some rank cannot read the chosen file (output dir not shared).
    """
    from lazytrain.errors import ConfigError, mark_agreed

    chosen = checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else ""
    chosen = comm.broadcast_object(chosen)
    readable = comm.all_gather(not chosen or os.path.isfile(chosen))
    missing = [rank for rank, ok in enumerate(readable) if not ok]
    if missing:
        raise mark_agreed(
            ConfigError(
                f"train.resume=true: rank 0 resumes from {chosen} (its last_checkpoint), but rank(s) "
                f"{', '.join(map(str, missing))} cannot read that file. train.output_dir must be on a file "
                "system that every machine of the job shares."
            )
        )
    return chosen


def _evaluate_only(cfg: DictConfig) -> dict:
    """``train.eval_only``: evaluate ``train.init_checkpoint``, between a header and a closing block as a
    training run has (`lazytrain.program.run_report`), and write ``metrics.json`` and the plots."""
    model = build_model(cfg)
    if cfg.train.get("init_checkpoint"):
        load_init_checkpoint(cfg, model)
    else:
        logger.warning(
            "train.eval_only=true without train.init_checkpoint: evaluating randomly initialised weights."
        )
    log_eval_header(cfg, model)
    start = time.perf_counter()
    results = do_test(cfg, model)

    # Same metrics.json format as training runs (the sweep summary reads the final metrics from it).
    if comm.is_main_process() and cfg.train.output_dir and results:
        with EventStorage(0) as storage:
            storage.put_scalars(**flatten_results(results), smoothing_hint=False)
            writer = JSONWriter(os.path.join(cfg.train.output_dir, "metrics.json"))
            writer.write()
            writer.close()
        write_run_plots(cfg.train.output_dir)
    log_eval_summary(cfg, results, time.perf_counter() - start)
    return results


def run(cfg: DictConfig) -> dict[str, Any]:
    """The per-rank program: `default_setup`, then evaluation only (``train.eval_only``) or training.

    Runs in every rank after the process group is up. Returns the final evaluation results (nested dict).
    """
    default_setup(cfg)
    if cfg.train.get("eval_only", False):
        return _evaluate_only(cfg)
    return do_train(cfg)
