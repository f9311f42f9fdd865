"""detectron2's own Mask R-CNN against lazytrain's on detectron2's weights: the same detections, in float64.

Builds detectron2's model from its source (a checkout on PYTHONPATH; CPU inference needs no C++ build), fills
every weight and frozen-BN statistic with random float64 values, saves them as a model-zoo style ``.pkl``
(numpy arrays) and as a ``.pth`` (``torch.save``), loads each through ``train.init_checkpoint``'s loader
(`lazytrain.modeling.weights.load_init_weights`) into recipes/models/mask_rcnn_fpn_detectron2.py's model, and
compares the detections (boxes, scores, classes, pasted masks) on images whose P5 grid is odd, at detectron2's
LVIS setting (1203 classes, score threshold 1e-4, 300 detections). Exits 1 when they differ.

detectron2 keeps boxes in float32 whatever the model's dtype (its decoding casts the deltas to float32, its
``Boxes`` hold float32): lazytrain's box coders' ``float32_decoding`` makes the float64 model decode as it does
(a float32 model does anyway). detectron2's ``batched_nms`` casts the boxes, not the scores, to float32, which
torchvision's ``nms`` refuses in a float64 model: the one patch here gives it the boxes in the scores' dtype.
The RPN's objectness logits are kept small enough (below ~30) that their sigmoids do not round to 1.0 in
float64: lazytrain ranks proposals by probability (torchvision's rule), detectron2 by logit, and saturated
probabilities would tie.

Command (detectron2's python dependencies, e.g. fvcore iopath yacs, installed with --no-deps into a venv that
also sees torch, torchvision and lazytrain):
    PYTHONPATH=/path/to/detectron2:. python scripts/detectron2_parity.py [--depth 101] [--faster-rcnn]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time

import torch

from lazytrain.config import LazyConfig, instantiate
from lazytrain.modeling.weights import load_init_weights

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (height, width) given to both models (the mapper's resize is not compared), and the original size the
# detections are mapped back to. Padded to 32, each P5 grid is odd in at least one side.
IMAGES = [((480, 736), (600, 920)), ((352, 544), (352, 544))]


def build_detectron2_model(depth: int, mask: bool) -> torch.nn.Module:
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    cfg = get_cfg()
    cfg.merge_from_file(
        os.path.join(_detectron2_root(), "configs/LVISv1-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml")
    )
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.RESNETS.DEPTH = depth
    cfg.MODEL.MASK_ON = mask
    assert cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST == 0.0001 and cfg.TEST.DETECTIONS_PER_IMAGE == 300
    return build_model(cfg).double().eval()


def patch_detectron2_nms() -> None:
    """detectron2's ``batched_nms`` with the boxes in the scores' dtype (see the module docstring)."""
    from detectron2.modeling.proposal_generator import proposal_utils
    from detectron2.modeling.roi_heads import fast_rcnn
    from torchvision.ops import boxes as box_ops

    def batched_nms(boxes, scores, idxs, iou_threshold):  # noqa: ANN001, ANN202
        return box_ops.batched_nms(boxes.to(scores.dtype), scores, idxs, iou_threshold)

    proposal_utils.batched_nms = fast_rcnn.batched_nms = batched_nms


def _detectron2_root() -> str:
    import detectron2

    return os.path.dirname(os.path.dirname(detectron2.__file__))


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights with activations of moderate size, and heads whose outputs are far from ties."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(tensor: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype) * (high - low) + low

    scales = {  # output heads: objectness ~0.4 (at most ~10), deltas ~0.3, class logits ~4, mask logits ~3 (std)
        "objectness_logits.weight": 0.01, "anchor_deltas.weight": 0.005, "cls_score.weight": 0.004,
        "bbox_pred.weight": 0.0003, "mask_head.predictor.weight": 0.015,
    }  # fmt: skip
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if ".norm." in name:
                low, high = {
                    "weight": (0.3, 0.7), "bias": (-0.1, 0.1), "running_mean": (-0.1, 0.1), "running_var": (0.5, 2.0),
                }[name.rsplit(".", 1)[1]]  # fmt: skip
                tensor.copy_(uniform(tensor, low, high))
            elif name.endswith(".bias"):
                tensor.copy_(uniform(tensor, -0.1, 0.1))
            elif name.endswith(".weight"):
                fan_in = tensor[0].numel()
                std = next((s for key, s in scales.items() if name.endswith(key)), (2.0 / fan_in) ** 0.5)
                tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * std)


def save_checkpoints(model: torch.nn.Module, folder: str) -> tuple[str, str]:
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    pkl, pth = os.path.join(folder, "model_final_random.pkl"), os.path.join(folder, "model_final_random.pth")
    with open(pkl, "wb") as file:
        arrays = {key: value.numpy() for key, value in state.items()}
        pickle.dump({"model": arrays, "__author__": "parity check", "matching_heuristics": False}, file)
    torch.save({"model": state, "iteration": 0}, pth)
    return pkl, pth


def build_lazytrain_model(depth: int, mask: bool, weights: str) -> torch.nn.Module:
    cfg = LazyConfig.load(os.path.join(REPO, "recipes/models/mask_rcnn_fpn_detectron2.py"))
    cfg.model.num_classes = 1203
    cfg.model.roi_heads.detections_per_img = 300
    cfg.model.roi_heads.score_thresh = 0.0001
    cfg.model.backbone.depth = depth
    if not mask:
        for key in ("mask_roi_pool", "mask_head", "mask_predictor"):
            del cfg.model.roi_heads[key]
    model = instantiate(cfg.model).double()  # before loading: folded frozen BNs fold in float64
    report = load_init_weights(model, weights)
    print(f"{os.path.basename(weights)}: {report.source}")
    print(f"  {len(report.loaded)} tensors loaded, missing {report.missing}, unexpected {report.unexpected}")
    model.rpn.box_coder.float32_decoding = True
    model.roi_heads.box_coder.float32_decoding = True
    return model.eval()


def make_inputs(seed: int) -> list[tuple[torch.Tensor, int, int]]:
    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for (height, width), (original_height, original_width) in IMAGES:
        coarse = torch.rand((1, 3, height // 16, width // 16), generator=generator, dtype=torch.float64)
        image = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")[0] * 255
        inputs.append((image, original_height, original_width))
    return inputs


def compare(d2_result: dict, lt_result: dict, mask: bool) -> dict:
    d2, lt = d2_result["instances"], lt_result["instances"]
    count = (len(d2), lt["boxes"].shape[0])
    summary = {"detections": count}
    if count[0] != count[1]:
        return summary
    summary["classes_equal"] = bool(torch.equal(d2.pred_classes, lt["classes"]))
    summary["max_box_diff"] = float((d2.pred_boxes.tensor.double() - lt["boxes"].double()).abs().max())
    summary["max_score_diff"] = float((d2.scores - lt["scores"]).abs().max())
    if mask:
        d2_masks, lt_masks = d2.pred_masks.bool(), lt["masks"].bool()
        summary["mask_pixels_differing"] = int((d2_masks != lt_masks).sum())
        summary["mask_pixels"] = int(d2_masks.sum())
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=50, choices=(50, 101))
    parser.add_argument("--faster-rcnn", action="store_true", help="no mask branch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    mask = not args.faster_rcnn
    torch.manual_seed(args.seed)
    patch_detectron2_nms()
    detectron2_model = build_detectron2_model(args.depth, mask)
    randomize(detectron2_model, args.seed)
    inputs = make_inputs(args.seed + 1)
    started = time.perf_counter()
    with torch.no_grad():
        d2_results = [
            detectron2_model([{"image": image.flip(0), "height": h, "width": w}])[0] for image, h, w in inputs
        ]
    print(f"detectron2: {time.perf_counter() - started:.1f} s")
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        for weights in save_checkpoints(detectron2_model, folder):
            model = build_lazytrain_model(args.depth, mask, weights)
            started = time.perf_counter()
            with torch.no_grad():
                lt_results = [model([{"image": image, "height": h, "width": w}])[0] for image, h, w in inputs]
            print(f"  lazytrain: {time.perf_counter() - started:.1f} s")
            for (image, _, _), d2_result, lt_result in zip(inputs, d2_results, lt_results):
                summary = compare(d2_result, lt_result, mask)
                print(f"  image {tuple(image.shape[1:])}: {summary}")
                same = (
                    summary["detections"][0] == summary["detections"][1]
                    and summary["classes_equal"]
                    and summary["max_box_diff"] <= 1e-9
                    and summary["max_score_diff"] <= 1e-9
                    and summary.get("mask_pixels_differing", 0) == 0
                )
                failures += not same
    print("PARITY" if not failures else f"DIFFERENT in {failures} comparisons")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
