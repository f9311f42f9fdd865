"""Every picture and plot script renders a valid, non-blank PNG from tiny fabricated inputs."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.utils.run_dirs import get_run_dirs, get_run_labels
from lazytrain.utils.visualizer import draw_instances, make_grid
from tests.scripts.loading import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_CONFIG = os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")
torch.set_num_threads(1)


def assert_picture(path, size=None):
    with Image.open(path) as image:
        image.load()
        assert image.width > 0 and image.height > 0
        if size is not None:
            assert image.size == size
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1, f"{path} is a single flat colour"


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory):
    datasets = tmp_path_factory.mktemp("datasets")
    root = generate_synthetic_lt(
        str(datasets / "synthetic_lt"),
        num_train=20,
        num_val=10,
        size_range=(64, 96),
        val_images_per_category=1,
    )
    previous = os.environ.get("LAZYTRAIN_DATASETS")
    os.environ["LAZYTRAIN_DATASETS"] = str(datasets)
    yield root
    if previous is None:
        del os.environ["LAZYTRAIN_DATASETS"]
    else:
        os.environ["LAZYTRAIN_DATASETS"] = previous


def write_run(run_dir, overrides, final_ap, iterations=(19, 39, 59)):
    os.makedirs(os.path.join(run_dir, ".hydra"), exist_ok=True)
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for step, iteration in enumerate(iterations):
            loss = 2.0 / (step + 1)
            line = {
                "iteration": iteration,
                "total_loss": loss,
                "loss_mask": loss / 3,
                "lr": 0.01 * (step + 1),
                "time": 0.5,
                "data_time": 0.01,
            }
            f.write(json.dumps(line) + "\n")
        evaluation = {
            "iteration": iterations[-1] + 1,
            "bbox/AP": final_ap + 1,
            "segm/AP": final_ap,
            "segm/APr": final_ap / 2,
            "segm/APc": final_ap * 0.9,
            "segm/APf": final_ap * 1.1,
        }
        f.write(json.dumps(evaluation) + "\n")
        f.write('{"iteration": 99, "total_lo')  # a run killed mid-write leaves a truncated line
    with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as f:
        f.write("".join(f"- {o}\n" for o in overrides))


@pytest.fixture
def sweep_dir(tmp_path):
    for job, thresh in enumerate(["0", "0.1", "0.3"]):
        write_run(
            str(tmp_path / str(job)),
            [f"dataloader.train.sampler.repeat_thresh={thresh}", "train.max_iter=60"],
            final_ap=5.0 + job,
        )
    (tmp_path / "summary.csv").write_text("job,segm/AP\n0,5\n1,6\n2,7\n")
    return str(tmp_path)


def test_draw_instances_and_grid():
    image = np.full((40, 60, 3), 128, np.uint8)
    masks = np.zeros((1, 40, 60), np.uint8)
    masks[0, 10:20, 10:30] = 1
    drawn = draw_instances(image, np.array([[5, 5, 40, 30]]), masks=masks, labels=["cat"])
    assert drawn.shape == image.shape and not np.array_equal(drawn, image)
    assert make_grid([drawn, drawn, drawn], cell_size=32, pad=2).shape == (2 + 2 * 34, 2 + 2 * 34, 3)


def test_sweep_labels_keep_only_differing_overrides(sweep_dir):
    run_dirs = get_run_dirs([sweep_dir])
    assert [os.path.basename(d) for d in run_dirs] == ["0", "1", "2"]
    assert get_run_labels(run_dirs)[1] == "dataloader.train.sampler.repeat_thresh=0.1"


def test_plot_metrics_single_and_sweep(tmp_path, sweep_dir):
    plot_metrics = load_script("plot_metrics")
    out = plot_metrics.main([os.path.join(sweep_dir, "0"), sweep_dir, "--out", str(tmp_path / "curves.png")])
    assert_picture(out)


def test_plot_metrics_rejects_non_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a run directory"):
        load_script("plot_metrics").main([str(tmp_path), "--out", str(tmp_path / "c.png")])


def test_plot_sweep(tmp_path, sweep_dir):
    out = load_script("plot_sweep").main(
        [sweep_dir, "--x", "dataloader.train.sampler.repeat_thresh", "--out", str(tmp_path / "sweep.png")]
    )
    assert_picture(out)


def test_visualize_predictions(tmp_path, synthetic_root):
    from pycocotools import mask as mask_util

    ground_truth_file = os.path.join(synthetic_root, "lvis_v1_val.json")
    ground_truth = json.load(open(ground_truth_file))
    results = []
    for image in ground_truth["images"][:3]:
        mask = np.zeros((image["height"], image["width"]), np.uint8, order="F")
        mask[10:40, 10:40] = 1
        rle = mask_util.encode(mask)
        rle["counts"] = rle["counts"].decode()
        for score in (0.9, 0.2):  # the low-scoring one is filtered out
            results.append(
                {
                    "image_id": image["id"],
                    "category_id": ground_truth["categories"][0]["id"],
                    "bbox": [10, 10, 30, 30],
                    "score": score,
                    "segmentation": rle,
                }
            )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "lvis_instances_results.json").write_text(json.dumps(results))
    paths = load_script("visualize_predictions").main(
        [
            str(run_dir),
            "--json-file",
            ground_truth_file,
            "--image-root",
            synthetic_root,
            "--num",
            "3",
            "--out",
            str(tmp_path / "vis"),
        ]
    )
    assert len(paths) == 4 and paths[-1].endswith("grid.png")
    first = ground_truth["images"][0]
    assert_picture(paths[0], size=(first["width"], first["height"]))
    for path in paths[1:]:
        assert_picture(path)


@pytest.mark.parametrize(
    "split, source",
    [
        pytest.param("train", "mapped", id="train-mapped"),
        pytest.param("test", "mapped", id="test-mapped"),
        pytest.param("train", "annotations", id="train-annotations"),
    ],
)
def test_visualize_data(tmp_path, synthetic_root, split, source):
    overrides = [
        "dataloader.train.mapper.augmentations.0.short_edge_length=[64]",
        "dataloader.train.mapper.augmentations.0.max_size=96",
    ]
    paths = load_script("visualize_data").main(
        [DEMO_CONFIG, *overrides, "--split", split, "--source", source, "--num", "4", "--out", str(tmp_path)]
    )
    assert len(paths) == 5 and os.path.basename(paths[-1]) == "grid.png"
    for path in paths:
        assert_picture(path)
    if split == "train" and source == "mapped":
        with Image.open(paths[0]) as image:
            assert min(image.size) == 64  # drawn after the config's resize augmentation


def test_plot_sweep_categorical_values(tmp_path):
    for job, sampler in enumerate(["TrainingSampler", "RepeatFactorTrainingSampler"]):
        write_run(str(tmp_path / "sweep" / str(job)), [f"sampler={sampler}"], final_ap=3.0 + job)
    out = load_script("plot_sweep").main(
        [str(tmp_path / "sweep"), "--x", "sampler", "--y", "segm/APr", "--out", str(tmp_path / "s.png")]
    )
    assert_picture(out)


def test_plot_sweep_without_the_metric_explains(tmp_path, sweep_dir):
    with pytest.raises(ValueError, match="no job has any of the metrics"):
        load_script("plot_sweep").main(
            [
                sweep_dir,
                "--x",
                "dataloader.train.sampler.repeat_thresh",
                "--y",
                "lvis/AP",
                "--out",
                str(tmp_path / "s.png"),
            ]
        )
