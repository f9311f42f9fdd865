"""README's AP-fixed command gives the paper's inference (Dave et al. 2021; the authors'
``lvdevil/infer_topk.py`` calls detectron2's ``fast_rcnn_inference`` with ``topk_per_image=-1``): every
detection above a low score threshold, no cap per image and none per class in an image, and K = 10,000
detections per category over the data set."""

from __future__ import annotations

import os
import re
import shlex

import torch

from lazytrain.config import LazyConfig
from lazytrain.modeling.box_selection import select_detections

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme_ap_fixed_command() -> list[str]:
    text = open(os.path.join(REPO, "README.md")).read()
    section = text.split("**AP-fixed and AP-pool**", 1)[1]
    (command,) = [line for line in re.findall(r"```bash\n(.*?)```", section, re.S)[0].splitlines() if line]
    return shlex.split(command)


def test_readme_command_keeps_every_detection_of_a_crowded_class():
    overrides = [
        arg for arg in _readme_ap_fixed_command() if arg.startswith(("model.", "++dataloader.evaluator"))
    ]
    cfg = LazyConfig.apply_overrides(
        LazyConfig.load(os.path.join(REPO, "conf", "rfs_maskrcnn_demo.py")), overrides
    )
    evaluator, heads = cfg.dataloader.evaluator, cfg.model.roi_heads
    k = evaluator.get("max_dets_per_category", 10_000)  # LVISEvaluator's default
    assert (evaluator.ap_fixed, evaluator.ap_pool, k) == (True, True, 10_000)
    assert heads.score_thresh <= 1e-4
    # One image with 1,200 objects of one class on a grid (no two overlap, so NMS keeps them all), each box
    # also scoring a little for a second class: 2,400 detections, all of which the paper's inference keeps.
    side = 35
    corners = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1)
    corners = corners.reshape(-1, 2)[:1200].float() * 10
    boxes = torch.cat([corners, corners + 8], dim=1)
    scores = torch.tensor([[0.05, 0.9, 0.05]]).repeat(len(boxes), 1)
    kept_boxes, kept_scores, labels = select_detections(
        boxes[:, None].repeat(1, 3, 1), scores, [boxes], [(side * 10, side * 10)],
        score_thresh=heads.score_thresh, nms_thresh=heads.nms_thresh,
        detections_per_img=heads.detections_per_img, detections_per_class=heads.detections_per_class,
    )  # fmt: skip
    assert torch.bincount(labels[0], minlength=3).tolist() == [0, 1200, 1200]
