"""Which scored boxes a detector keeps: the score threshold, the smallest size, NMS within each group (FPN level
or class) and the best few of each image, as torchvision's RPN and RoI heads keep them.

`select_detections` is the RoI heads' selection (`RoIHeads`, `CascadeRoIHeads`): the thresholds for the whole
batch with one host read, NMS image by image. The steps one image at a time (`nms_in_image`, `has_min_size`)
serve it under tracing and ``torch.export`` and the RPN's exported proposals too.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import boxes as box_ops

from lazytrain.modeling.box_coding import clip_to_image_sizes
from lazytrain.modeling.host_values import to_device
from lazytrain.modeling.nms import batched_nms

__all__ = ["DETECTION_MIN_SIZE", "has_min_size", "nms_in_image", "select_detections"]

# torchvision's RoI heads drop detections smaller than this (in pixels, either side) before NMS.
DETECTION_MIN_SIZE = 1e-2


def has_min_size(boxes: Tensor, min_size: float, *, strict: bool = False) -> Tensor:
    """Whether each box of `boxes` [..., 4] (XYXY) is at least `min_size` wide and high (torchvision's
    ``remove_small_boxes`` as a mask), or with `strict` wider and higher than `min_size` (detectron2's
    ``Boxes.nonempty(threshold=min_size)``)."""
    widths, heights = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    if strict:
        return (widths > min_size) & (heights > min_size)
    return (widths >= min_size) & (heights >= min_size)


def nms_in_image(
    boxes: Tensor,
    scores: Tensor,
    groups: Tensor,
    iou_threshold: float,
    image_shape: tuple[int, int],
    limit: int,
    *,
    compiled: bool = False,
    limit_per_group: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One image's boxes, scores and groups kept by NMS within each group (`lazytrain.modeling.nms.batched_nms`),
    at most `limit_per_group` of each group (None: no such limit) and `limit` in all, best first.

    Args:
        boxes: [K, 4] boxes clipped to `image_shape`.
        scores: [K] their scores.
        groups: [K] their group (FPN level, class): NMS compares boxes of one group only.
        iou_threshold: IoU above which the lower-scoring box of a pair is dropped.
        image_shape: (height, width) of the image.
        limit: how many boxes to keep at most.
        compiled: `batched_nms`'s ``compiled``.
        limit_per_group: how many boxes of one group to keep at most.
    """
    # One dtype for both, the wider (a float64 model's scores with its float32-decoded boxes).
    dtype = torch.promote_types(boxes.dtype, scores.dtype)
    keep = batched_nms(
        boxes.to(dtype), scores.to(dtype), groups, iou_threshold, image_shape, compiled=compiled
    )
    if limit_per_group is not None:
        keep = keep[_is_among_best_of_group(groups[keep], limit_per_group)]
    keep = keep[:limit]
    return boxes[keep], scores[keep], groups[keep]


def select_detections(
    boxes: Tensor,
    scores: Tensor,
    proposals: list[Tensor],
    image_shapes: list[tuple[int, int]],
    *,
    score_thresh: float,
    nms_thresh: float,
    detections_per_img: int,
    compiled_nms: bool = False,
    detections_per_class: int | None = None,
    min_size: float = DETECTION_MIN_SIZE,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Per image: boxes, scores and labels (1..K) of the detections kept from every RoI's decoded boxes
    `boxes` [R, K+1, 4] and `scores` [R, K+1] (RoIs of all images in the order of `proposals`): score
    threshold (`score_thresh`, exclusive), boxes narrower or lower than `min_size` (torchvision's
    `DETECTION_MIN_SIZE`; detectron2 keeps every box: 0), per-class NMS (`nms_thresh`), top
    `detections_per_img` (torchvision's steps and results; column 0, the background, is never a detection).

    `detections_per_class` (None: no such limit) keeps at most that many of each class per image before the
    `detections_per_img` cut. With a low `score_thresh` and a large `detections_per_img` it gives every class
    its best few boxes in each image without letting the classes that fire everywhere fill the image's
    budget, the inference that AP-fixed (`lazytrain.evaluation.fixed_ap`) wants; it costs one host read per
    image more.

    The thresholds run on the whole batch with one host read (torchvision: two ``torch.where`` per image),
    NMS image by image; under tracing and ``torch.export``, everything image by image, which records no
    candidate count.
    """
    if detections_per_class is not None and detections_per_class < 1:
        raise ValueError(
            "select_detections(detections_per_class=) must be >= 1, or None for no limit; got "
            f"{detections_per_class!r}"
        )
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        # shape[0], not len(): a trace (model export) keeps the former dynamic and freezes the latter.
        per_image = [p.shape[0] for p in proposals]
        candidates = [
            _candidates_in_image(image_boxes, image_scores, image_shape, score_thresh, min_size)
            for image_boxes, image_scores, image_shape in zip(
                boxes.split(per_image), scores.split(per_image), image_shapes
            )
        ]
    else:
        candidates = zip(*_batch_candidates(boxes, scores, proposals, image_shapes, score_thresh, min_size))
    kept = [
        nms_in_image(
            *found,
            nms_thresh,
            image_shape,
            detections_per_img,
            compiled=compiled_nms,
            limit_per_group=detections_per_class,
        )
        for found, image_shape in zip(candidates, image_shapes)
    ]
    return [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]


def _is_among_best_of_group(groups: Tensor, limit: int) -> Tensor:
    """For boxes in score order (best first), whether each is among the first `limit` of its group."""
    order = torch.argsort(groups, stable=True)
    sorted_groups = groups[order]
    positions = torch.arange(groups.shape[0], device=groups.device)
    rank = torch.empty_like(positions)
    rank[order] = positions - torch.searchsorted(sorted_groups, sorted_groups)  # minus the group's first
    return rank < limit


def _is_candidate(boxes: Tensor, scores: Tensor, score_thresh: float, min_size: float) -> Tensor:
    """Which (RoI, class) pairs, boxes clipped and without the background, can be detections."""
    return (scores > score_thresh) & has_min_size(boxes, min_size)


def _batch_candidates(
    boxes: Tensor,
    scores: Tensor,
    proposals: list[Tensor],
    image_shapes: list[tuple[int, int]],
    score_thresh: float,
    min_size: float,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Per image, the boxes, scores and labels of every (RoI, foreground class) scoring above
    `score_thresh` whose box, clipped to its image, is large enough, in torchvision's order (RoI, then
    class); the host reads the number per image, once for the batch."""
    num_images, num_classes = len(proposals), scores.shape[1] - 1
    counts = to_device([p.shape[0] for p in proposals], boxes.device)
    image_of_roi = torch.arange(num_images, device=boxes.device).repeat_interleave(
        counts, output_size=boxes.shape[0]
    )
    sizes = to_device(image_shapes, boxes.device, boxes.dtype)
    boxes = clip_to_image_sizes(boxes[:, 1:], sizes[image_of_roi])  # column 0, the background: never
    scores = scores[:, 1:]
    candidate = _is_candidate(boxes, scores, score_thresh, min_size)
    per_image = torch.zeros(num_images, dtype=torch.int64, device=boxes.device)
    per_image = per_image.index_add_(0, image_of_roi, candidate.sum(dim=1)).tolist()  # the host read
    index = torch.nonzero_static(candidate.flatten(), size=sum(per_image))[:, 0]
    labels = index % num_classes + 1
    found = (boxes.reshape(-1, 4)[index], scores.flatten()[index], labels)
    return tuple(values.split(per_image) for values in found)


def _candidates_in_image(
    boxes: Tensor, scores: Tensor, image_shape: tuple[int, int], score_thresh: float, min_size: float
) -> tuple[Tensor, Tensor, Tensor]:
    """One image's candidates (as `_batch_candidates`), found with ``torch.where``. `boxes` [R, K+1, 4],
    `scores` [R, K+1]."""
    boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
    labels = torch.arange(scores.shape[1], device=scores.device).view(1, -1).expand_as(scores)
    # Column 0 is the background: never a detection.
    boxes, scores, labels = boxes[:, 1:].reshape(-1, 4), scores[:, 1:].flatten(), labels[:, 1:].flatten()
    keep = torch.where(_is_candidate(boxes, scores, score_thresh, min_size))[0]
    return boxes[keep], scores[keep], labels[keep]
