"""The two preflight entry points: `preflight(cfg)` gives every problem of a job at once, and
`check_command_line` checks the config the command line makes (with every value a grid sweep gives, a user's
json data sets included) before Hydra creates the run or sweep directory."""

import importlib.util
import os
import shutil

import pytest
from omegaconf import OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.errors import ConfigError
from lazytrain.program.default import INJECTED_ARGUMENTS
from lazytrain.program.preflight import check_command_line, preflight
from lazytrain.program.preflight.backends import find_compiled_nms_problems
from lazytrain.program.preflight.processes import find_launch_problems
from lazytrain.program.primary_config import DEFAULT_MAIN, load_primary_config
from tests.data.custom_fixtures import write_export
from tests.warm_command import run_warm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE_TOY = os.path.join(REPO, "tests", "engine", "toy_config.py")
CUSTOM = os.path.join(REPO, "conf", "rfs_maskrcnn_custom.py")
DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return write_export(str(tmp_path_factory.mktemp("export")))


def test_preflight_returns_every_problem_of_a_job_at_once(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.model._target_ = "tests.engine.toy.NoSuchModel"
    cfg.launch.num_processes = 0
    cfg.train.init_checkpoint = str(tmp_path / "missing.pth")
    problems = preflight(cfg, INJECTED_ARGUMENTS)
    assert len(problems) == 3, problems
    assert problems[0] == (
        "model._target_: cannot import 'tests.engine.toy.NoSuchModel': 'tests.engine.toy' has no attribute "
        "'NoSuchModel'"
    )
    assert problems[1] == "launch.num_processes=0: must be an integer >= 1."
    assert problems[2].startswith(f"train.init_checkpoint={tmp_path / 'missing.pth'}: no such file.")


def test_a_key_launch_does_not_have_is_a_problem_naming_the_closest():
    cfg = load_primary_config(ENGINE_TOY)
    cfg.launch.num_proceses = 2
    cfg.launch.nodes = 2
    assert find_launch_problems(cfg.launch) == [
        "launch.num_proceses: not a launch key, so it would change nothing. Did you mean launch.num_processes? "
        "launch takes num_gpus, num_processes, num_machines, machine_rank, dist_url, timeout, main.",
        "launch.nodes: not a launch key, so it would change nothing. launch takes num_gpus, num_processes, "
        "num_machines, machine_rank, dist_url, timeout, main.",
    ]


def test_preflight_of_a_sound_job_finds_nothing(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    assert preflight(cfg, INJECTED_ARGUMENTS) == []


def test_backend_settings_torch_would_refuse_are_named_before_the_run(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.train.cudnn_benchmark = "yes"
    cfg.train.float32_matmul_precision = "tf32"
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "train.cudnn_benchmark='yes': must be true or false (detectron2's key: let cuDNN time its convolution "
        "algorithms for each new input shape; it pays when the shapes repeat).",
        "train.float32_matmul_precision='tf32': must be one of highest, high, medium "
        "(torch.set_float32_matmul_precision; 'high' runs float32 matmuls in TF32 on Ampere and later).",
    ]


@pytest.mark.parametrize(
    ("compile_settings", "problem"),
    [
        ({"enabled": "yes"}, "train.compile.enabled='yes': must be true or false."),
        ({"backend": "fast"}, "train.compile.backend='fast': not a torch.compile backend; one of "),
        ({"mode": "fastest"}, "train.compile.mode='fastest' (backend 'inductor'): modes are inductor's ("),
        (
            {"mode": "reduce-overhead", "backend": "aot_eager"},
            "train.compile.mode='reduce-overhead' (backend 'aot_eager'): modes are inductor's (",
        ),
        ({"mode": "reduce-overhead"}, None),
        ({"backend": "aot_eager"}, None),
    ],
)
def test_compile_settings_torch_would_refuse_are_named_before_the_run(tmp_path, compile_settings, problem):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.train.compile = {"enabled": True, "mode": None, "backend": "inductor", **compile_settings}
    problems = preflight(cfg, INJECTED_ARGUMENTS)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_compiling_on_the_cpu_without_a_cpp_compiler_is_named_before_the_run(tmp_path, monkeypatch):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.train.device = "cpu"
    cfg.train.compile = {"enabled": True, "mode": None, "backend": "inductor"}
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "train.compile.enabled=true with train.device=cpu: inductor compiles C++ and finds no compiler (g++, "
        "clang++, or $CXX). Install one (apt install g++), or use train.compile.backend=aot_eager."
    ]
    cfg.train.compile.backend = "aot_eager"
    assert preflight(cfg, INJECTED_ARGUMENTS) == []


@pytest.mark.parametrize(
    ("device", "compiled", "missing", "problem"),
    [
        ("cpu", True, None, None),
        ("cpu", False, "compiler", None),
        ("cpu", "yes", None, "model.rpn.compiled_nms='yes': must be true or false."),
        (
            "cpu",
            True,
            "compiler",
            "model.rpn.compiled_nms=true with train.device=cpu: inductor compiles C++ and finds no compiler (g++, "
            "clang++, or $CXX). Install one (apt install g++), or use model.rpn.compiled_nms=false.",
        ),
        (
            "cuda",
            True,
            "triton",
            "model.rpn.compiled_nms=true on a GPU: inductor generates Triton kernels and the triton package is "
            "missing (it comes with torch's CUDA wheels: pip install triton).",
        ),
    ],
)
def test_a_compiled_nms_without_its_code_generator_is_named_before_the_run(
    monkeypatch, device, compiled, missing, problem
):
    model = {"rpn": {"compiled_nms": compiled}, "roi_heads": {"compiled_nms": False}}
    cfg = OmegaConf.create({"train": {"device": device}, "model": model})
    if missing == "compiler":
        monkeypatch.setattr(shutil, "which", lambda name: None)
    if missing == "triton":
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert find_compiled_nms_problems(cfg) == ([] if problem is None else [problem])


def test_both_compiled_nms_keys_are_checked_and_named_together(monkeypatch):
    model = {"rpn": {"compiled_nms": True}, "roi_heads": {"compiled_nms": 1}}
    cfg = OmegaConf.create({"train": {"device": "cpu"}, "model": model})
    assert find_compiled_nms_problems(cfg) == ["model.roi_heads.compiled_nms=1: must be true or false."]
    cfg.model.roi_heads.compiled_nms = True
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert find_compiled_nms_problems(cfg) == [
        "model.rpn.compiled_nms=true and model.roi_heads.compiled_nms=true with train.device=cpu: inductor "
        "compiles C++ and finds no compiler (g++, clang++, or $CXX). Install one (apt install g++), or use "
        "model.rpn.compiled_nms=false and model.roi_heads.compiled_nms=false."
    ]


def test_preflight_checks_the_gpu_count_once_the_launch_values_are_sound(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.launch.num_gpus = 2  # with train.device=cpu
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "launch.num_gpus=2 but train.device is not cuda; set train.device=cuda, or use launch.num_processes=N "
        "for N CPU processes."
    ]


def test_a_launch_main_that_does_not_import_is_a_problem_naming_the_key(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.launch.main = "lazytrain.engine.defaults.run"  # the default program's path in earlier versions
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "launch.main=lazytrain.engine.defaults.run: cannot import 'lazytrain.engine.defaults.run': "
        "'lazytrain.engine' has no attribute 'defaults'. It names the function each rank runs (default: "
        f"{DEFAULT_MAIN})."
    ]


def _data_overrides(export: dict[str, str], train_json: str) -> list[str]:
    given = {**export, "data.train.json": train_json, "train.device": "cpu"}  # the GPU count is checked too
    return [f"{key}={value}" for key, value in given.items()]


def test_every_value_of_a_grid_sweep_over_a_data_file_is_checked(export, tmp_path):
    cfg = load_primary_config(CUSTOM)
    good = export["data.train.json"]
    copy = str(tmp_path / "copy.json")
    shutil.copy(good, copy)
    check_command_line(
        cfg, ["-m", *_data_overrides(export, f"{good},{copy}")], DEFAULT_MAIN, INJECTED_ARGUMENTS
    )  # no problem
    missing = str(tmp_path / "missing.json")
    with pytest.raises(ConfigError) as error:
        check_command_line(
            cfg, ["-m", *_data_overrides(export, f"{good},{missing}")], DEFAULT_MAIN, INJECTED_ARGUMENTS
        )
    assert str(error.value) == (
        "the data set files have problems:\n"
        f"  data.train.json={missing}: no such file; pass the path of the COCO/LVIS json (data.train.json=PATH)."
    )


def test_a_data_file_left_unset_in_a_grid_sweep_is_reported_before_it_starts(export):
    cfg = load_primary_config(CUSTOM)
    overrides = [o for o in _data_overrides(export, "unused") if not o.startswith("data.val.json=")]
    with pytest.raises(ConfigError, match="data.val.json is not set; pass data.val.json=PATH"):
        check_command_line(cfg, ["-m", *overrides], DEFAULT_MAIN, INJECTED_ARGUMENTS)


def test_a_bad_file_in_a_sweep_stops_the_command_before_hydra_writes_anything(export, tmp_path):
    missing = str(tmp_path / "missing.json")
    sweep_dir = tmp_path / "sweep"
    overrides = _data_overrides(export, f"{export['data.train.json']},{missing}")
    arguments = [CUSTOM, "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    result = run_warm(arguments, tmp_path, dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert result.returncode == 1
    assert f"data.train.json={missing}: no such file" in result.stderr
    assert not sweep_dir.exists()


WANDB = "lazytrain.engine.trackers.wandb.WandbTracker"


def test_values_a_component_would_refuse_are_named_with_their_keys(tmp_path):
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.train.ema = {"enabled": True, "decay": 1.5, "tau": -1}
    cfg.train.hooks.wandb = {"_target_": WANDB, "output_dir": str(tmp_path), "mode": "ofline"}
    cfg.train.hooks.quiet = {"_target_": WANDB, "output_dir": str(tmp_path), "mode": "disabled"}
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "train.ema.decay=1.5: must be in [0, 1) (the decay after the warm-up); got 1.5. E.g. 0.9998 averages over "
        "the last ~5000 steps.",
        "train.ema.tau=-1: must be >= 0 (the warm-up's time constant in optimizer steps; 0: no warm-up); got -1.",
        "train.hooks.wandb.mode='ofline': W&B's mode is one of online, offline, disabled, or null (WANDB_MODE if "
        "set, else online with W&B credentials and offline without). Did you mean train.hooks.wandb.mode=offline?",
    ]
    cfg.train.ema = {"enabled": False, "decay": 0.9}
    cfg.train.hooks.wandb.mode = None
    assert preflight(cfg, INJECTED_ARGUMENTS) == []
    cfg.train.ema = {"enabled": "yes", "decay": 1.5}  # a decay that is never meant, even with the EMA off
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "train.ema.enabled='yes': must be true or false.",
        "train.ema.decay=1.5: must be in [0, 1) (the decay after the warm-up); got 1.5. E.g. 0.9998 averages over "
        "the last ~5000 steps.",
    ]


def test_a_timm_model_name_timm_does_not_know_is_named_with_the_closest(tmp_path):
    pytest.importorskip("timm")
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.model = {"_target_": "lazytrain.modeling.TimmBackbone", "model_name": "resnet18dd"}
    problems = preflight(cfg, INJECTED_ARGUMENTS)
    assert len(problems) == 1
    assert problems[0].startswith("model.model_name=resnet18dd: not a timm model. Did you mean: resnet18d")


def test_a_checkpointed_resnet_with_sync_batch_norm_is_named_before_the_run(tmp_path):
    """build_resnet_fpn_backbone refuses it too, but only when the model is built, after the run folder and its
    config.yaml are written; with no trainable stage nothing is checkpointed and it builds."""
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    cfg.model = {
        "_target_": "lazytrain.modeling.build_resnet_fpn_backbone",
        "depth": 18,
        "norm": "SyncBN",
        "grad_checkpointing": True,
    }
    assert preflight(cfg, INJECTED_ARGUMENTS) == [
        "model.grad_checkpointing=True with model.norm='SyncBN': a checkpointed stage's recompute would "
        "all-reduce the batch statistics a second time, inside the backward pass; set model.norm=BN "
        "(per-process statistics) or FrozenBN, or model.grad_checkpointing=false."
    ]
    cfg.model.trainable_layers = 0
    assert preflight(cfg, INJECTED_ARGUMENTS) == []
    cfg.model.trainable_layers, cfg.model.norm = 3, "BN"
    assert preflight(cfg, INJECTED_ARGUMENTS) == []


MIXTURE = [
    "dataloader.train.sampler._target_=lazytrain.data.mixture_sampler.MixtureTrainingSampler.from_dataset_names",
    "~dataloader.train.sampler.dataset_dicts",
    "+dataloader.train.sampler.names=[synthetic_lt_train,synthetic_lt_val]",
    "+dataloader.train.sampler.ratios=[3,1]",
    "+dataloader.train.sampler.total_batch_size=${..total_batch_size}",
    "dataloader.train.aspect_ratio_grouping=false",
]


@pytest.mark.parametrize(
    "overrides, problem",
    [
        pytest.param([], None, id="sound"),
        pytest.param(
            ["dataloader.train.sampler.ratios=[1]"],
            "dataloader.train.sampler.ratios=[1]: MixtureTrainingSampler(ratios=) needs one ratio per source (2: "
            "synthetic_lt_train, synthetic_lt_val); got [1]. Give e.g. ratios=[1, 1] for equal shares.",
            id="ratios-length",
        ),
        pytest.param(
            ["dataloader.train.sampler.ratios=[9,1]"],
            "dataloader.train.sampler.ratios=[9, 1]: MixtureTrainingSampler(ratios=): the ratios 9:1 give "
            "synthetic_lt_val no image of the 4 per step (total_batch_size=4 over world_size=1); expected at least "
            "one image of every source in every step's batch. total_batch_size=6 is enough, or raise the "
            "smallest ratios.",
            id="source-without-images",
        ),
        pytest.param(
            ["dataloader.train.aspect_ratio_grouping=true"],
            "dataloader.train.aspect_ratio_grouping=True: MixtureTrainingSampler: "
            "dataloader.train.aspect_ratio_grouping=True would form batches of landscape or of portrait images "
            "only, not of the per-source shares; set dataloader.train.aspect_ratio_grouping=False.",
            id="aspect-ratio-grouping",
        ),
        pytest.param(
            ["dataloader.train.sampler.total_batch_size=8"],
            "dataloader.train.sampler.total_batch_size=8: MixtureTrainingSampler: "
            "dataloader.train.total_batch_size=4 but the sampler's shares are for total_batch_size=8; set "
            'dataloader.train.sampler.total_batch_size="${..total_batch_size}".',
            id="total-batch-mismatch",
        ),
    ],
)
def test_mixture_settings_the_sampler_or_loader_would_refuse_are_named_before_the_run(
    tmp_path, overrides, problem
):
    """MixtureTrainingSampler and the train loader refuse them too, but only when the loader is built: after
    the run folder is written and every source data set loaded."""
    cfg = load_primary_config(DEMO)
    cfg.train.output_dir = str(tmp_path)
    LazyConfig.apply_overrides(cfg, MIXTURE + overrides)
    assert preflight(cfg, INJECTED_ARGUMENTS) == ([problem] if problem else [])


def test_each_value_of_a_grid_sweep_is_checked_before_hydra_and_a_search_space_is_left_to_the_sweeper():
    cfg = load_primary_config(ENGINE_TOY)
    overrides = ["-m", "train.ema.enabled=true", "train.ema.decay=0.9,1.5,0.99", "train.max_iter=2,3"]
    with pytest.raises(ConfigError) as error:
        check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS)
    assert str(error.value).startswith("train.ema.decay=1.5: must be in [0, 1)")
    assert "\n" not in str(error.value)
    cfg.train.ema.decay = 1.5  # what the config says; the sweeper draws the values
    overrides = ["-m", "train.ema.enabled=true", "train.ema.decay=interval(0.9,0.999)"]
    check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS)


def test_before_hydra_a_check_that_needs_the_run_directory_is_left_to_the_job():
    cfg = load_primary_config(ENGINE_TOY)  # train.output_dir: ${hydra:runtime.output_dir}
    cfg.train.resume = True
    check_command_line(cfg, ["train.max_iter=3"], DEFAULT_MAIN, INJECTED_ARGUMENTS)
    cfg.launch.num_processes = 0
    with pytest.raises(ConfigError, match=r"^launch.num_processes=0: must be an integer >= 1.$"):
        check_command_line(cfg, [], DEFAULT_MAIN, INJECTED_ARGUMENTS)


def test_each_value_of_an_added_swept_key_is_checked_once(tmp_path):
    """`-m +key=a,b` adds the key once per job: the check gives each value its own copy of the config."""
    cfg = load_primary_config(ENGINE_TOY)
    cfg.train.output_dir = str(tmp_path)
    overrides = ["-m", "+model.nan_at_call=1,-1", "train.ema.decay=0.5,1.5", f"hydra.sweep.dir={tmp_path}/s"]
    with pytest.raises(ConfigError) as error:
        check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS)
    assert str(error.value).startswith("train.ema.decay=1.5: must be in [0, 1)"), str(error.value)
    check_command_line(
        cfg, [*overrides[:2], f"hydra.sweep.dir={tmp_path}/s"], DEFAULT_MAIN, INJECTED_ARGUMENTS
    )


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_training_from_scratch_over_an_earlier_run_is_refused_before_anything_is_written(tmp_path, sweep):
    cfg = load_primary_config(ENGINE_TOY)
    folder = tmp_path / "runs" / "a"
    run = folder / "0" if sweep else folder
    run.mkdir(parents=True)
    (run / "model_final.pth").write_bytes(b"weights")
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    overrides = (["-m", "train.max_iter=2,3"] if sweep else []) + [f"{key}={folder}"]
    with pytest.raises(ConfigError, match=rf"{key}=.*holds .*model_final.pth.*train.resume=true"):
        check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS)
    assert sorted(p.name for p in run.iterdir()) == ["model_final.pth"]
    check_command_line(cfg, [*overrides, "train.resume=true"], DEFAULT_MAIN, INJECTED_ARGUMENTS)


@pytest.mark.parametrize("folder_problem", ["earlier run", "cannot create"])
def test_a_bad_value_is_named_beside_a_problem_of_the_run_folder(tmp_path, folder_problem):
    """Following the folder's advice (train.resume=true, another folder) must not be the way to learn of the
    bad value: each is one line, the value first."""
    cfg = load_primary_config(ENGINE_TOY)
    if folder_problem == "earlier run":
        folder = tmp_path / "run"
        folder.mkdir()
        (folder / "model_final.pth").write_bytes(b"weights")
    else:
        (tmp_path / "file").write_text("")
        folder = tmp_path / "file" / "run"
    overrides = ["launch.num_processes=two", f"hydra.run.dir={folder}"]
    with pytest.raises(ConfigError) as error:
        check_command_line(cfg, overrides, DEFAULT_MAIN, INJECTED_ARGUMENTS)
    value, folder_line = str(error.value).split("\n")
    assert value == "launch.num_processes=two: must be an integer >= 1."
    assert folder_line.startswith(f"hydra.run.dir={folder}: ")
    assert ("holds an earlier run" if folder_problem == "earlier run" else "cannot create") in folder_line
