"""Bad input on the command line: a short message naming the culprit, a non-zero exit status, no traceback
(unless HYDRA_FULL_ERROR=1), and nothing already on disk overwritten."""

import os
import shutil

import pytest
import torch
from pytest import param

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from tests.launch.test_entrypoint import ENGINE_TOY, REPO, lazytrain

DEMO = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
DEMO_TIMM = os.path.join(REPO, "conf", "rfs_maskrcnn_demo_timm.py")
WANDB = "lazytrain.engine.trackers.wandb.WandbTracker"
# The demo's sampler made a two-source mixture (MixtureTrainingSampler.from_dataset_names).
MIXTURE = [
    "dataloader.train.sampler._target_=lazytrain.data.mixture_sampler.MixtureTrainingSampler.from_dataset_names",
    "~dataloader.train.sampler.dataset_dicts",
    "+dataloader.train.sampler.names=[synthetic_lt_train,synthetic_lt_val]",
    "+dataloader.train.sampler.total_batch_size=${..total_batch_size}",
]


def assert_short_error(result, *fragments):
    """Exit status 1, no traceback anywhere, and the last stderr line names every fragment."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lazytrain: "), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last
    return last


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        param(
            "launch.num_processes=0", ["launch.num_processes=0", "must be an integer >= 1"], id="no-processes"
        ),
        param("launch.machine_rank=3", ["launch.machine_rank=3", "[0, 0]"], id="machine-rank"),
        # The form the misspelled-key error offers for new keys: refused too, not a silent one-process run.
        param(
            "+launch.num_proceses=2",
            ["launch.num_proceses", "one typo apart", "Did you mean 'launch.num_processes=2'?"],
            id="added-misspelled-launch-key",
        ),
        param(
            "++launch.num_proceses=2",
            ["launch.num_proceses", "not a launch key", "Did you mean launch.num_processes?"],
            id="force-added-misspelled-launch-key",
        ),
        param(
            "train.device=cuda",
            ["train.device=cuda", "no GPU is visible", "train.device=cpu"],
            id="cuda-without-gpu",
        ),
        param(
            "train.max_iter=${nope.x}",
            ["train.max_iter=${nope.x}", "'nope.x' not found"],
            id="broken-interpolation",
        ),
        param(
            "hydra.run.dir=/proc/lazytrain/run",
            ["hydra.run.dir=/proc/lazytrain/run", "cannot create a directory under /proc"],
            id="unwritable-run-dir",
        ),
    ],
)
def test_bad_value_is_one_line_before_anything_runs(tmp_path, override, fragments):
    if override == "train.device=cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    args = [ENGINE_TOY, override]
    if not override.startswith("hydra.run.dir"):
        args.append(f"hydra.run.dir={tmp_path}/run")
    assert_short_error(lazytrain(*args, cwd=tmp_path), *fragments)
    assert not (tmp_path / "run").exists()  # checked before Hydra made the run directory


@pytest.mark.parametrize(
    ("config", "overrides", "line"),
    [
        param(
            DEMO,
            ["+model.roi_heads.batch_size_per_imag=3"],
            "lazytrain: model.roi_heads.batch_size_per_imag: lazytrain.modeling.roi_heads.RoIHeads has no argument "
            "'batch_size_per_imag'. Did you mean 'batch_size_per_image'? Accepted: compiled_nms, detections_per_class, "
            "detection_min_size, box_roi_pool, ",
            id="argument-of-a-base-class",
        ),
        param(
            ENGINE_TOY,
            ["train.ema.decay=1.5"],
            "lazytrain: train.ema.decay=1.5: must be in [0, 1) (the decay after the warm-up); got 1.5. E.g. 0.9998",
            id="ema-decay",
        ),
        param(
            ENGINE_TOY,
            [f"+train.hooks.wandb={{_target_:{WANDB},output_dir:${{train.output_dir}},mode:ofline}}"],
            "lazytrain: train.hooks.wandb.mode='ofline': W&B's mode is one of online, offline, disabled, or null ",
            id="wandb-mode",
        ),
        param(
            DEMO_TIMM,
            ["model.backbone.model_name=resnet18dd"],
            "lazytrain: model.backbone.model_name=resnet18dd: not a timm model. Did you mean: resnet18d",
            id="timm-model-name",
        ),
        param(
            DEMO,
            ["dataloader.train.sampler.repeat_thresh=-1"],
            "lazytrain: dataloader.train.sampler.repeat_thresh=-1: must be a number >= 0 (0 = uniform sampling",
            id="repeat-thresh",
        ),
        param(
            DEMO,
            ["model.roi_heads.score_thresh=-0.5"],
            "lazytrain: model.roi_heads.score_thresh=-0.5: must be a number in [0, 1].",
            id="score-thresh",
        ),
        param(
            DEMO,
            ["model.backbone.norm=SyncBN", "model.backbone.grad_checkpointing=true"],
            "lazytrain: model.backbone.grad_checkpointing=True with model.backbone.norm='SyncBN': a checkpointed "
            "stage's recompute would all-reduce",
            id="checkpointed-sync-batch-norm",
        ),
        param(
            DEMO,
            [
                *MIXTURE,
                "+dataloader.train.sampler.ratios=[3]",
                "dataloader.train.aspect_ratio_grouping=false",
            ],
            "lazytrain: dataloader.train.sampler.ratios=[3]: MixtureTrainingSampler(ratios=) needs one ratio per "
            "source (2: synthetic_lt_train, synthetic_lt_val); got [3].",
            id="mixture-ratios",
        ),
        param(
            DEMO,
            [*MIXTURE, "+dataloader.train.sampler.ratios=[3,1]"],
            "lazytrain: dataloader.train.aspect_ratio_grouping=True: MixtureTrainingSampler: "
            "dataloader.train.aspect_ratio_grouping=True would form batches of landscape or of portrait images",
            id="mixture-aspect-ratio-grouping",
        ),
    ],
)
def test_a_value_a_component_would_refuse_is_one_line_before_the_run_directory_exists(
    tmp_path, config, overrides, line
):
    if config == DEMO_TIMM:
        pytest.importorskip("timm")
    result = lazytrain(config, *overrides, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert assert_short_error(result).startswith(line)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


def test_run_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("keep")
    result = lazytrain(ENGINE_TOY, f"hydra.run.dir={tmp_path}/file/run", cwd=tmp_path)
    assert_short_error(result, f"{tmp_path}/file/run", "is a file")
    assert (tmp_path / "file").read_text() == "keep"


def test_a_bad_value_over_an_earlier_run_is_named_first_and_the_run_kept(tmp_path):
    """Before, only the earlier run was named: the user who then added train.resume=true met the value."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model_final.pth").write_text("weights")
    result = lazytrain(ENGINE_TOY, "launch.num_processes=two", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-2:] == [
        "lazytrain: launch.num_processes=two: must be an integer >= 1.",
        f"hydra.run.dir={tmp_path}/run: holds an earlier run ({tmp_path}/run/model_final.pth); training there "
        "from scratch would overwrite its weights and checkpoints. Continue it with train.resume=true, or "
        "choose another hydra.run.dir (or delete the folder to start over).",
    ]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["model_final.pth"]
    assert (tmp_path / "run" / "model_final.pth").read_text() == "weights"


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        param(
            "train.max_iter=[1,", ["the '[' at character 16 is never closed", "close it with ']'"], id="list"
        ),
        param("train.output_dir='run", ["the quote ' at character 18 is never closed"], id="quote"),
    ],
)
def test_an_override_the_grammar_refuses_is_one_line_naming_it(tmp_path, override, fragments):
    result = lazytrain(DEMO, override, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    last = assert_short_error(result, f"cannot parse override '{override}'", *fragments)
    assert result.stderr.strip() == last  # no antlr traceback before it
    assert not (tmp_path / "run").exists()


def test_full_error_shows_the_traceback(tmp_path):
    result = lazytrain(ENGINE_TOY, "launch.num_processes=0", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_init_checkpoint_that_is_not_a_checkpoint(tmp_path):
    readme = os.path.join(REPO, "README.md")
    result = lazytrain(
        ENGINE_TOY, f"hydra.run.dir={tmp_path}/run", f"train.init_checkpoint={readme}", cwd=tmp_path
    )
    last = assert_short_error(
        result, f"train.init_checkpoint={readme}", "not a checkpoint", "not a torch file"
    )
    assert "unpickling" not in last
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_resume_over_a_damaged_checkpoint_names_it_and_keeps_the_files(tmp_path, damage):
    run_dir = tmp_path / "run"
    first = lazytrain(ENGINE_TOY, f"hydra.run.dir={run_dir}", "train.max_iter=10", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    final = run_dir / "model_final.pth"
    data = final.read_bytes()
    final.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"hello\n")
    kept = [name for name in os.listdir(run_dir) if (run_dir / name).is_file() and name != "log.txt"]
    before = {name: (run_dir / name).read_bytes() for name in kept}

    result = lazytrain(
        ENGINE_TOY, f"hydra.run.dir={run_dir}", "train.max_iter=20", "train.resume=true", cwd=tmp_path
    )
    reason = "a truncated or damaged torch file" if damage == "truncated" else "not a torch file"
    last = assert_short_error(
        result, "train.resume=true", f"{final} (named in last_checkpoint) is not a checkpoint: {reason}"
    )
    assert "unpickling" not in last
    for name, content in before.items():
        assert (run_dir / name).read_bytes() == content, name


@pytest.mark.slow
def test_garbage_images_are_one_line_naming_a_file(tmp_path):
    root = tmp_path / "datasets"
    generate_synthetic_lt(str(root / "synthetic_lt"), num_train=8, num_val=2, size_range=(64, 64))
    for name in os.listdir(root / "synthetic_lt" / "train"):
        (root / "synthetic_lt" / "train" / name).write_bytes(b"garbage, not a JPEG")
    shutil.rmtree(root / "synthetic_lt" / "val")  # never read: training fails first
    result = lazytrain(
        DEMO,
        f"hydra.run.dir={tmp_path}/run",
        "model.num_classes=30",
        "dataloader.train.total_batch_size=2",
        cwd=tmp_path,
        env={"LAZYTRAIN_DATASETS": str(root)},
    )
    last = assert_short_error(
        result, "failed to map", "cannot read image", "not an image file PIL can decode"
    )
    assert str(root / "synthetic_lt" / "train") in last
    assert not (tmp_path / "run" / "last_checkpoint").exists()
