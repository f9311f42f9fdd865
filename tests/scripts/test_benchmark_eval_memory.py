"""scripts/benchmark_eval_memory.py with --ap-fixed: the top K's phases on rank 0, then the metrics."""

from faster_coco_eval import COCO, COCOeval_faster

from lazytrain.evaluation import LVISEvaluator, coco_evaluation, lvis_evaluation
from lazytrain.evaluation.fixed_ap import CategoryTopK
from lazytrain.utils import comm
from tests.scripts.loading import load_script

# What the script wraps to time each phase: restored after the test.
_WRAPPED = [
    (comm, "gather"),
    (CategoryTopK, "merge"),
    (CategoryTopK, "get_detections"),
    (lvis_evaluation, "evaluate_fixed_ap"),
    (coco_evaluation, "write_coco_results"),
    (coco_evaluation, "DetectionTable"),
    (LVISEvaluator, "_load_ground_truth"),
    (LVISEvaluator, "_evaluate_task"),
    (COCO, "loadRes"),
    (COCOeval_faster, "evaluate"),
    (COCOeval_faster, "accumulate"),
    (COCOeval_faster, "summarize"),
]


def test_ap_fixed_top_k_is_measured_and_evaluated(tmp_path, monkeypatch, capsys):
    for owner, name in _WRAPPED:  # monkeypatch puts back a class's own attribute (or removes an added one)
        monkeypatch.setattr(owner, name, getattr(owner, name))
    arguments = ["--images", "30", "--detections", "20", "--categories", "40", "--ap-fixed", "5"]
    arguments += [
        "--standard-detections",
        "3",
        "--world-size",
        "1",
        "--check-images",
        "1",
        "--no-write-results",
    ]
    load_script("benchmark_eval_memory").main([*arguments, "--workdir", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert "30 images x 20 detections = 600 on 1 rank(s)" in out
    assert "| top K per category (5), pickled: each rank's / all |" in out
    assert "| top K: merge (receiving each rank's share in turn, if streamed) | 1 |" in out
    assert "| segm: evaluate_fixed_ap | 1 |" in out and "'APfixed': " in out and "'APpool_r': " in out
