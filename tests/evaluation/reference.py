"""The evaluators' results before predictions were kept compactly (lazytrain 8b47ede), as the reference.

Then `process` kept one COCO result dict per detection and `evaluate` gave all of them to the COCO API in one
run over every image and category. The functions here do exactly that, straight on the libraries.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pycocotools.mask as mask_util
import torch


def reference_entries(inputs, outputs, category_ids, max_dets_per_image=None) -> list[dict]:
    """One COCO result dict per detection, built as the evaluator built them (LVIS: top-k per image)."""
    entries = []
    for record, output in zip(inputs, outputs):
        instances = output["instances"]
        if max_dets_per_image is not None and len(instances["scores"]) > max_dets_per_image:
            keep = torch.as_tensor(instances["scores"]).topk(max_dets_per_image).indices
            instances = {key: value[keep] for key, value in instances.items()}
        boxes = torch.as_tensor(instances["boxes"]).double().reshape(-1, 4).clone()  # float64: not in place
        boxes[:, 2:] -= boxes[:, :2]
        image = [
            {
                "image_id": int(record["image_id"]),
                "category_id": int(category_ids[c]),
                "bbox": box,
                "score": float(s),
            }
            for c, box, s in zip(instances["classes"].tolist(), boxes.tolist(), instances["scores"].tolist())
        ]
        if "masks" in instances and image:
            array = np.asfortranarray(instances["masks"].numpy().astype(np.uint8).transpose(1, 2, 0))
            for entry, rle in zip(image, mask_util.encode(array)):
                rle["counts"] = rle["counts"].decode("ascii")
                entry["segmentation"] = rle
        entries.extend(image)
    return entries


def reference_evaluation(json_file, entries, task, image_ids, max_dets, lvis_style):
    """(faster-coco-eval's stats_as_dict, per-category AP x 100) of one run over everything."""
    from faster_coco_eval import COCO, COCOeval_faster

    drop = "segmentation" if task == "bbox" else "bbox"
    with contextlib.redirect_stdout(io.StringIO()):
        ground_truth = COCO(json_file)
        detections = ground_truth.loadRes([{k: v for k, v in e.items() if k != drop} for e in entries])
        coco_eval = COCOeval_faster(ground_truth, detections, task, lvis_style=lvis_style)
        coco_eval.params.imgIds = image_ids
        coco_eval.params.maxDets = max_dets
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    per_category = []
    precision = np.asarray(coco_eval.eval["precision"])[:, :, :, 0, -1]
    for index in range(precision.shape[2]):
        values = precision[:, :, index]
        values = values[values > -1]
        per_category.append(float(values.mean()) * 100.0 if values.size else float("nan"))
    return coco_eval.stats_as_dict, per_category
