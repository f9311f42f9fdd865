"""The sweep figure (summary.png, scripts/plot_sweep.py): panels, lines, error bars over seeds, symlog x."""

import json
import os

from lazytrain.utils.plots import build_sweep_figure
from lazytrain.utils.run_dirs import get_sweep_points, get_swept_key

THRESHOLDS = ("0", "0.001", "0.01", "0.1")
NAMES = ("AP", "APr", "APc", "APf")


def make_sweep(root, seeds=(0, 1, 2)):
    """A fabricated repeat_thresh x seed sweep: metric = 10 * (threshold index + 1) + seed (+1 for box)."""
    run_dirs = []
    for job, (index, seed) in enumerate((i, s) for i in range(len(THRESHOLDS)) for s in seeds):
        run_dir = os.path.join(root, str(job))
        os.makedirs(os.path.join(run_dir, ".hydra"))
        overrides = [f"dataloader.train.sampler.repeat_thresh={THRESHOLDS[index]}", f"train.seed={seed}"]
        with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as f:
            f.write("".join(f"- {o}\n" for o in overrides + ["train.max_iter=2"]))
        metrics = {
            f"{task}/{n}": 10.0 * (index + 1) + seed + (task == "bbox")
            for task in ("segm", "bbox")
            for n in NAMES
        }
        with open(os.path.join(run_dir, "metrics.json"), "w") as f:
            f.write(json.dumps({"iteration": 1, "total_loss": 2.0}) + "\n")
            f.write(json.dumps({"iteration": 2, **metrics, "segm/AP50": 1.0}) + "\n")
        run_dirs.append(run_dir)
    return run_dirs


def test_swept_key_is_the_numeric_key_other_than_the_seed():
    runs = [["a=x", "t=0", "train.seed=0"], ["a=y", "t=0.1", "train.seed=1"]]
    assert get_swept_key(runs) == "t"
    assert get_swept_key([["a=x", "train.seed=0"], ["a=y", "train.seed=1"]]) == "a"
    assert get_swept_key([["train.seed=0"], ["train.seed=1"]]) is None


def test_sweep_figure_has_mask_and_box_panels_with_seed_error_bars_on_symlog_x(tmp_path):
    import matplotlib.pyplot as plt

    key = "dataloader.train.sampler.repeat_thresh"
    points = get_sweep_points(make_sweep(str(tmp_path)), key)
    assert sorted(points) == sorted(f"{t}/{n}" for t in ("segm", "bbox") for n in NAMES)  # no AP50
    assert sorted(points["segm/APr"]) == sorted(
        (t, 10.0 * (i + 1) + s) for i, t in enumerate(THRESHOLDS) for s in range(3)
    )
    figure = build_sweep_figure(points, key)
    try:
        mask, box = figure.axes
        assert mask.get_title() == "mask (segm)" and box.get_title() == "box (bbox)"
        assert mask.get_xscale() == "symlog" and mask.get_xlabel() == key
        assert [t.get_text() for t in figure.legends[0].get_texts()] == list(NAMES)
        assert len(mask.containers) == 4  # one errorbar container per metric
        line = mask.containers[1].lines[0]  # APr: means over the 3 seeds (+0, +1, +2 -> +1)
        assert list(line.get_xdata()) == [0.0, 0.001, 0.01, 0.1]
        assert list(line.get_ydata()) == [11.0, 21.0, 31.0, 41.0]
        assert list(box.containers[0].lines[0].get_ydata()) == [12.0, 22.0, 32.0, 42.0]
        bars = mask.containers[1].lines[2][0].get_segments()  # min-max over seeds: 10..12 at t=0
        assert [tuple(p[1] for p in bars[0])] == [(10.0, 12.0)]
        assert "min-max" in figure._suptitle.get_text()
    finally:
        plt.close(figure)


def test_single_seed_sweep_draws_plain_lines_on_a_linear_axis(tmp_path):
    import matplotlib.pyplot as plt

    points = {"segm/AP": [("0.1", 1.0), ("0.3", 2.0)], "segm/APr": [("0.1", 0.5), ("0.3", 0.0)]}
    figure = build_sweep_figure(points, "t")
    try:
        (axis,) = figure.axes
        assert axis.get_xscale() == "linear" and not axis.containers
        assert [list(line.get_ydata()) for line in axis.get_lines()] == [[1.0, 2.0], [0.5, 0.0]]
    finally:
        plt.close(figure)
