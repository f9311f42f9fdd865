"""A training step whose tensors have the same shapes at every step (opt-in: `RCNN(fixed_shapes=...)`).

The default training step (`RCNN.forward` -> `RegionProposalNetwork` -> `RoIHeads`) sizes its tensors by the
data: the proposals NMS keeps, the ground truth of each image, the RoIs sampled, the foreground RoIs of the
mask branch. The host reads those sizes from the device (host syncs, `lazytrain.utils.host_syncs`), and a
compiled graph or a CUDA graph cannot be recorded once for every step. `fixed_shape_losses` computes the same
losses on fixed capacities, with validity masks where the dynamic path has fewer rows:

- images padded to `FixedShapes.image_size`; ground-truth boxes, classes and masks padded to
  `FixedShapes.max_instances` per image (`pad_batch`, on the host, before anything reaches the device; a
  batch with more is a ValueError naming the key; `FixedShapes.check_data` checks the data set's most
  instances per image and the mapper's largest image before the first step, from
  `lazytrain.data.training_extent`);
- the RPN's proposals: NMS decides each level's first ``DECIDED_PER_RESULT * post_nms_top_n`` candidates in
  `NMS_STEPS` greedy steps (the dynamic path's first pass, which it repeats where that is not final: here a
  device counter, `FixedShapeCounters.nms_not_final`, counts those steps instead) and one more, so that
  where the steps have not settled the proposals are a subset of greedy NMS's (never a box it suppresses;
  ``GroupedNMS.survivors(never_suppressed=True)``), and each image gets ``post_nms_top_n`` rows with a validity
  mask;
- the RoI heads: the ground truth is added to the proposals, matched and sampled on [N, P + G] rows; each
  image keeps the sampler's ``batch_size_per_image`` rows, foreground first, those not drawn invalid;
  the mask branch takes at most `FixedShapes.mask_positives` foreground rows per image (beyond it a uniform
  subsample of the sampler's uniform draw; `FixedShapeCounters.dropped_mask_positives` counts the rest; the
  trainer's `PeriodicWriter` logs the counters as ``fixed_shapes/*`` metrics);
- RoI pooling pools every RoI from every FPN level and keeps its own level's result (L times the pooling
  work, no per-level counts to read); the losses are masked sums with the dynamic path's normalisation.

With capacities that nothing exceeds, and the same sampled examples, the losses and gradients are the dynamic
path's (tests/modeling/test_fixed_shapes.py, float64) where the dynamic batches are padded to `image_size` as
well: fixed-size crops (LSJ) or ``model.pad_to_sizes=[image_size]``. Padded beyond a batch's own padded size,
the anchors over the extra padding are easy negatives the RPN's sampler draws, and the features near the
images' borders (and BatchNorm's statistics, where the backbone trains them) change: every loss differs (all
five did at image_size 128 for 64 px images). The function is traceable whole by ``torch.compile(...,
fullgraph=True)``. Supported: `SoftmaxCrossEntropy` classification (the default), `MaskPredictor` mask
predictors, heads without BatchNorm (padding rows would enter its statistics), no keypoints.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import concat_box_prediction_layers
from torchvision.ops import roi_align
from torchvision.ops.poolers import LevelMapper

from lazytrain.modeling.box_coding import clip_to_image_sizes
from lazytrain.modeling.classification_losses import SoftmaxCrossEntropy
from lazytrain.modeling.heads import MaskPredictor
from lazytrain.modeling.matching import PaddedBoxes, gather_boxes, match_padded
from lazytrain.modeling.nms import GroupedNMS
from lazytrain.modeling.poolers import EpsilonInsideLogLevelMapper
from lazytrain.modeling.roi_losses import box_regression_loss, get_predictor_loss
from lazytrain.modeling.rpn import DECIDED_PER_RESULT, RegionProposalNetwork, _Candidates, _valid_first

__all__ = ["FixedBatch", "FixedShapeCounters", "FixedShapes", "fixed_shape_losses", "pad_batch"]

logger = logging.getLogger(__name__)

# The padding multiple `check_image_size` rounds its suggestions up to where the caller gives none:
# `RCNN(size_divisible=)`'s default.
_SIZE_DIVISIBLE = 32


@dataclass(frozen=True)
class FixedShapes:
    """The capacities of a training step with fixed shapes (``model.fixed_shapes``).

    Args:
        image_size: [height, width] every training batch is padded to (images larger: a ValueError), each a
            multiple of the model's ``size_divisible`` (32; checked by `check_model`: the anchors' strides
            follow from it as in the dynamic path). The losses equal the dynamic step's only where its batches
            are padded to the same size (see the module's docstring).
        max_instances: ground-truth instances per image (more: a ValueError naming
            ``model.fixed_shapes.max_instances``); LVIS's train set has up to 294 per image. Memory grows
            with it: the masks are [N, max_instances, H, W] uint8 on the device (pinned on the host too) and
            their RoIAlign input a float copy of them, 4 bytes a pixel: at 294, 1024 x 1024 and 2 images per
            GPU, about 0.6 GB of masks and 2.5 GB of float32 copy each step.
        mask_positives: foreground RoIs per image in the mask branch; None: the RoI sampler's most
            positives (``batch_size_per_image * positive_fraction``), which nothing exceeds.
    """

    image_size: Sequence[int]
    max_instances: int
    mask_positives: int | None = None

    def __post_init__(self) -> None:
        size = [int(v) for v in self.image_size]
        if len(size) != 2 or min(size) < 1:
            raise ValueError(
                f"FixedShapes(image_size=) (model.fixed_shapes.image_size) must be [height, width] > 0; got "
                f"{self.image_size!r}"
            )
        object.__setattr__(self, "image_size", tuple(size))
        for name in ("max_instances", "mask_positives"):
            value = getattr(self, name)
            if value is None and name == "mask_positives":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"FixedShapes({name}=) (model.fixed_shapes.{name}) must be an int >= 1; got {value!r}"
                )

    def check_instances(self, count: int, where: str = "a training image") -> None:
        """Raise a ValueError when `count` instances (of one image) exceed `max_instances`: for the checks
        before a run (the data set's most instances per image) and for each batch."""
        if count > self.max_instances:
            raise ValueError(
                f"FixedShapes: {where} has {count} instances, above model.fixed_shapes.max_instances="
                f"{self.max_instances}. Raise model.fixed_shapes.max_instances to at least {count}."
            )

    def check_image_size(
        self,
        height: int,
        width: int,
        where: str = "a training image",
        size_divisible: int = _SIZE_DIVISIBLE,
    ) -> None:
        """Raise a ValueError when a `height` x `width` image does not fit in `image_size`; the size it
        suggests is rounded up to a multiple of `size_divisible` (the model's)."""
        fixed_height, fixed_width = self.image_size
        if height > fixed_height or width > fixed_width:
            needed = [
                _round_up(max(height, fixed_height), size_divisible),
                _round_up(max(width, fixed_width), size_divisible),
            ]
            raise ValueError(
                f"FixedShapes: {where} is {height} x {width}, larger than model.fixed_shapes.image_size="
                f"[{fixed_height}, {fixed_width}]. Raise model.fixed_shapes.image_size to at least {needed}."
            )

    def check_data(
        self, most_instances: int | None, fullest_image: str, largest_size: Sequence[int] | None
    ) -> None:
        """The checks before a run: the data set's `most_instances` in one image (`fullest_image` names it)
        and the `largest_size` [height, width] its mapper makes (None: unknown; each batch checks its own, and
        one warning here says so)."""
        if most_instances is not None:
            self.check_instances(most_instances, f"the training image {fullest_image}")
        if largest_size is not None:
            self.check_image_size(*largest_size, where="the train mapper's largest image")
        unknown = [
            f"{what} (model.fixed_shapes.{key})"
            for what, key, value in (
                ("the most instances per image", "max_instances", most_instances),
                ("the largest image", "image_size", largest_size),
            )
            if value is None
        ]
        if unknown:
            logger.warning(
                "Fixed shapes: %s of the training data could not be checked before the run (augmentations or "
                "a data set whose extent is unknown); the first batch beyond the capacity stops the run with "
                "the key to raise.",
                " and ".join(unknown),
            )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class FixedBatch(NamedTuple):
    """A training batch at fixed shapes (`pad_batch`): N images padded to [H, W], G instances per image."""

    images: Tensor  # [N, 3, H, W] uint8 (or float), 0-255 scale, zeros where padded
    image_sizes: Tensor  # [N, 2] int64 (height, width) of each image before padding
    boxes: Tensor  # [N, G, 4] float32 XYXY, zeros where padded
    labels: Tensor  # [N, G] int64 classes 1..K (0: the background), 0 where padded
    valid: Tensor  # [N, G] bool: the real instances
    masks: Tensor | None  # [N, G, H, W] uint8, or None without a mask head


class FixedShapeCounters(NamedTuple):
    """What the fixed-shape step did differently from the dynamic one, counted on the device (read them at
    logging time: reading is a host sync). Zero-dimensional int64 tensors, summed over the batch."""

    dropped_mask_positives: Tensor  # foreground RoIs beyond `FixedShapes.mask_positives`
    nms_not_final: Tensor  # 1 where the RPN's NMS needed more than its steps (the proposals may differ)


def _has_area(boxes: Tensor) -> Tensor:
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def _non_empty_first(boxes: Tensor, fixed: FixedShapes) -> tuple[Tensor, Tensor]:
    """The rows of `boxes` to pad, those with an area first (in their order), and which of them have an area
    (all but the empty boxes that fill the last rows when there is room for them).

    Zero-area boxes (a crop leaves them; the dynamic path drops them) are left out and not counted against
    `max_instances`. The rows are ordered by a stable sort instead of a boolean index: the loader's tensors
    stay on the host in a GPU run, but the CPU's host-sync count (the proxy) would see a boolean index, and
    the count is read from the data only when the rows exceed the capacity."""
    has_area = _has_area(boxes)
    rows = torch.argsort((~has_area).to(torch.uint8), stable=True)
    count = boxes.shape[0]
    if count > fixed.max_instances:
        count = int(has_area.sum())
        fixed.check_instances(count)
    rows = rows[:count]
    return rows, has_area[rows]


def _pad_masks(masks: Tensor, height: int, width: int) -> Tensor:
    """[G, h, w] masks in an [G, height, width] canvas, zeros beyond, with the last row and column repeated
    once: RoIAlign then samples the same values inside the image as from the unpadded masks, whose border it
    extends by clamping."""
    count, h, w = masks.shape
    canvas = masks.new_zeros((count, height, width))
    canvas[:, :h, :w] = masks
    if h < height:
        canvas[:, h, :w] = masks[:, h - 1]
    if w < width:
        canvas[:, : min(h + 1, height), w] = canvas[:, : min(h + 1, height), w - 1]
    return canvas


def pad_batch(
    batched_inputs: Sequence[Mapping[str, Any]],
    fixed: FixedShapes,
    device: torch.device,
    with_masks: bool,
    size_divisible: int = _SIZE_DIVISIBLE,
) -> FixedBatch:
    """Mapper outputs as a `FixedBatch` on `device`: padded on the host (where the loader put them), checked
    against `fixed`'s capacities there (sizes suggested as multiples of `size_divisible`), then copied without
    blocking. Empty boxes (zero width or height, from crops) are left out, as the dynamic path drops them,
    and do not count against ``max_instances``."""
    height, width = fixed.image_size
    num_images, capacity = len(batched_inputs), fixed.max_instances
    first = batched_inputs[0]["image"]
    images = first.new_zeros((num_images, 3, height, width))
    sizes = torch.zeros((num_images, 2), dtype=torch.int64)
    boxes = torch.zeros((num_images, capacity, 4), dtype=torch.float32)
    labels = torch.zeros((num_images, capacity), dtype=torch.int64)
    valid = torch.zeros((num_images, capacity), dtype=torch.bool)
    masks = torch.zeros((num_images, capacity, height, width), dtype=torch.uint8) if with_masks else None
    for index, record in enumerate(batched_inputs):
        image, instances = record["image"], record.get("instances")
        if instances is None:
            raise ValueError("RCNN: training inputs need 'instances'; build the mapper with is_train=True.")
        h, w = image.shape[-2:]
        fixed.check_image_size(h, w, size_divisible=size_divisible)
        image_boxes = torch.as_tensor(instances["boxes"], dtype=torch.float32).reshape(-1, 4)
        rows, kept = _non_empty_first(image_boxes, fixed)  # rows without an area are zeros in what follows
        count = rows.shape[0]
        images[index, :, :h, :w] = image
        sizes[index] = torch.tensor((h, w))
        boxes[index, :count] = torch.where(kept[:, None], image_boxes[rows], 0.0)  # a NaN box too
        labels[index, :count] = (torch.as_tensor(instances["classes"]).long()[rows] + 1) * kept
        valid[index, :count] = kept
        if masks is not None:
            if "masks" not in instances:
                raise ValueError("RCNN: this model has a mask head but 'instances' has no 'masks'.")
            if count:
                image_masks = torch.as_tensor(instances["masks"])[rows] * kept[:, None, None]
                masks[index, :count] = _pad_masks(image_masks, height, width)
    values = (images, sizes, boxes, labels, valid, masks)
    # From page-locked memory the copies run alongside the GPU's work; from pageable memory the host waits.
    pin = device.type == "cuda"
    return FixedBatch(
        *(v if v is None else (v.pin_memory() if pin else v).to(device, non_blocking=True) for v in values)
    )


def check_model(model: nn.Module) -> None:
    """Refuse, before a run, the parts the fixed-shape step does not implement."""
    heads = model.roi_heads
    problems = []
    if not isinstance(get_predictor_loss(heads.box_predictor), SoftmaxCrossEntropy):
        problems.append("a classification loss other than softmax cross-entropy (box_predictor.loss)")
    if heads.has_mask() and not isinstance(heads.mask_predictor, MaskPredictor):
        problems.append("a mask predictor other than lazytrain.modeling.MaskPredictor")
    if not isinstance(model.rpn, RegionProposalNetwork):
        problems.append("an RPN other than lazytrain.modeling.RegionProposalNetwork")
    if not hasattr(model.rpn.anchor_generator, "_make_anchors"):
        problems.append("an anchor generator other than lazytrain.modeling.AnchorGenerator")
    if heads.has_keypoint():
        problems.append("a keypoint branch")
    for name in ("box_head", "mask_head"):
        head = getattr(heads, name, None)
        if head is not None and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in head.modules()):
            problems.append(f"BatchNorm in roi_heads.{name} (padding rows would enter its statistics)")
    if isinstance(heads.box_predictor, nn.ModuleList):
        problems.append("cascade RoI heads")
    if problems:
        raise ValueError(
            "RCNN(fixed_shapes=...) (model.fixed_shapes) does not support " + "; ".join(problems) + ". Set "
            "model.fixed_shapes=null for the dynamic training step."
        )
    # The anchor generator derives each level's stride from the padded size (size // grid): a size that is not
    # a multiple would give strides below the real ones (1333 // 334 = 3 at P2) and anchors short of the
    # bottom and right of the image.
    multiple = int(model.transform.size_divisible)
    size = list(model.fixed_shapes.image_size)
    if any(side % multiple for side in size):
        rounded = [_round_up(side, multiple) for side in size]
        raise ValueError(
            f"RCNN(fixed_shapes=...): model.fixed_shapes.image_size={size} must be multiples of the model's "
            f"size_divisible={multiple} (model.size_divisible); got {size}. Set model.fixed_shapes.image_size="
            f"{rounded} (rounded up)."
        )


def fixed_shape_losses(
    model: nn.Module, batch: FixedBatch, fixed: FixedShapes
) -> tuple[dict[str, Tensor], FixedShapeCounters]:
    """The training losses of `model` (an `RCNN`; typed as a module: rcnn.py imports this one) on `batch` with
    every shape fixed by the batch's shapes, `fixed` and the model's settings: ``loss_objectness``,
    ``loss_rpn_box_reg``, ``loss_classifier``, ``loss_box_reg`` and, with a mask head, ``loss_mask``; and the
    step's `FixedShapeCounters`. No host syncs; traceable whole."""
    images = _normalized(model, batch.images, batch.image_sizes)
    features = model.backbone(images)
    if isinstance(features, Tensor):
        features = {"0": features}
    proposals, proposal_valid, rpn_losses, nms_not_final = _rpn(model, images, features, batch)
    heads = model.roi_heads
    samples = _sample_rois(heads, proposals, proposal_valid, batch)
    # Under autocast the maps the poolers read in float32 (as `RoIHeads.forward`), and the RoIs with them.
    features = heads._pooled_maps_in_float32(features)
    losses = {**_box_losses(heads, features, samples, images.shape[-2:]), **rpn_losses}
    dropped = samples.valid.new_zeros((), dtype=torch.int64)
    if heads.has_mask():
        capacity = fixed.mask_positives or heads.fg_bg_sampler.max_positives
        loss_mask, dropped = _mask_loss(heads, features, samples, batch, capacity, images.shape[-2:])
        losses["loss_mask"] = loss_mask
    return losses, FixedShapeCounters(dropped, nms_not_final)


def _normalized(model: nn.Module, images: Tensor, image_sizes: Tensor) -> Tensor:
    """`NoResizeTransform.normalized_batch` of images already padded: normalised, and 0 outside each image
    (the dynamic batch's padding), the same values."""
    transform = model.transform
    dtype = images.dtype if images.is_floating_point() else torch.float32
    mean, std = transform.pixel_mean.to(dtype), transform.pixel_std.to(dtype)
    batch = images.to(dtype=dtype, memory_format=model.memory_format).sub(mean).div(std)
    rows = torch.arange(images.shape[-2], device=images.device) < image_sizes[:, 0, None]
    columns = torch.arange(images.shape[-1], device=images.device) < image_sizes[:, 1, None]
    inside = rows[:, None, :, None] & columns[:, None, None, :]
    return batch.masked_fill(~inside, 0.0)


def _rpn(
    model: nn.Module, images: Tensor, features: dict[str, Tensor], batch: FixedBatch
) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor]:
    """The RPN at fixed shapes: proposals [N, P, 4] and their validity [N, P] (P = ``post_nms_top_n()``), the
    RPN's losses, and whether NMS was not final (0-dim int64)."""
    rpn = model.rpn
    maps = list(features.values())
    objectness, deltas = rpn.head(maps)
    num_images = images.shape[0]
    anchors = _anchors(rpn.anchor_generator, images, maps)
    num_anchors_per_level = [o[0].numel() for o in objectness]
    objectness, deltas = concat_box_prediction_layers(objectness, deltas)
    decoded = rpn.box_coder.decode_single(deltas.detach(), anchors.repeat(num_images, 1))
    decoded = decoded.view(num_images, -1, 4)
    proposals, valid, not_final = _proposals(
        rpn, decoded, objectness, batch.image_sizes, num_anchors_per_level
    )
    gt = PaddedBoxes(batch.boxes, batch.valid)
    stacked = anchors.expand(num_images, -1, -1)
    matches = match_padded(
        rpn.proposal_matcher, gt, PaddedBoxes(stacked, torch.ones_like(stacked[..., 0]).bool())
    )
    matched_gt_boxes = gather_boxes(gt.boxes, matches.clamp(min=0))
    labels = (matches >= 0).to(torch.float32)
    labels.masked_fill_(matches == rpn.proposal_matcher.BETWEEN_THRESHOLDS, -1.0)
    targets = rpn.box_coder.encode_single(matched_gt_boxes.flatten(0, 1), stacked.flatten(0, 1))
    loss_objectness, loss_rpn_box_reg = rpn.compute_loss(
        objectness, deltas, list(labels.unbind()), list(targets.view(num_images, -1, 4).unbind())
    )
    losses = {"loss_objectness": loss_objectness, "loss_rpn_box_reg": loss_rpn_box_reg}
    return proposals, valid, losses, not_final


def _anchors(generator: nn.Module, images: Tensor, maps: list[Tensor]) -> Tensor:
    """[A, 4] float32 anchors of one image: eager, the generator's kept ones; compiled, made in the graph (the
    generator's cache is Python state, and under compilation it would follow the maps' dtype)."""
    if torch.compiler.is_compiling():
        grid_sizes = tuple(tuple(m.shape[-2:]) for m in maps)
        return generator._make_anchors(grid_sizes, tuple(images.shape[-2:]), images.device)
    image_list = ImageList(images, [tuple(images.shape[-2:])] * images.shape[0])
    return generator(image_list, maps)[0]


def _proposals(
    rpn: nn.Module, decoded: Tensor, objectness: Tensor, image_sizes: Tensor, num_anchors_per_level: list[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """`RegionProposalNetwork.filter_proposals`'s batched selection with its first NMS pass only: each image's
    best ``post_nms_top_n()`` kept proposals, best first, padded, with their validity."""
    _, boxes, scores = rpn._top_scored(decoded, objectness, num_anchors_per_level)
    boxes = _clip(boxes, image_sizes)
    level_sizes = [min(rpn.pre_nms_top_n(), count) for count in num_anchors_per_level]
    candidates = _valid_first(_Candidates(boxes, scores, rpn._is_valid(boxes, scores), level_sizes))
    limit = rpn.post_nms_top_n()
    nms = GroupedNMS(*candidates, rpn.nms_thresh, compiled=rpn.compiled_nms)
    # Unsettled steps would keep boxes greedy NMS suppresses (duplicates); the odd step keeps none of them.
    keep, is_final = nms.survivors(
        needed=limit, decide_first=math.ceil(DECIDED_PER_RESULT * limit), never_suppressed=True
    )
    ranked = candidates.scores.masked_fill(~keep, -math.inf)
    order = ranked.sort(dim=1, descending=True, stable=True).indices[:, :limit]
    proposals = gather_boxes(candidates.boxes, order)
    count = keep.sum(dim=1, keepdim=True)
    valid = torch.arange(order.shape[1], device=order.device) < count
    return proposals, valid, (~is_final).to(torch.int64)


def _clip(boxes: Tensor, image_sizes: Tensor) -> Tensor:
    """[N, K, 4] boxes clipped to their image's [N, 2] (height, width), in the boxes' dtype."""
    return clip_to_image_sizes(boxes, image_sizes.to(boxes.dtype))


class _Samples(NamedTuple):
    """The sampled RoIs of each image at fixed shapes, [N, S] (foreground first, then background, then
    padding rows that are not valid)."""

    boxes: Tensor  # [N, S, 4]
    valid: Tensor  # [N, S]
    labels: Tensor  # [N, S] matched class, 0 the background (and padding)
    index: Tensor  # [N, S] matched ground-truth index (0 where none)
    regression_targets: Tensor  # [N, S, 4]
    num_foreground: Tensor  # [N]


def _sample_rois(heads: nn.Module, proposals: Tensor, proposal_valid: Tensor, batch: FixedBatch) -> _Samples:
    """`RoIHeads.select_training_samples` at fixed shapes: ground truth added to the proposals ([N, P + G]),
    matched, sampled, and the first ``batch_size_per_image`` rows of each image kept."""
    rois = PaddedBoxes(
        torch.cat((proposals, batch.boxes.to(proposals.dtype)), dim=1),
        torch.cat((proposal_valid, batch.valid), dim=1),
    )
    gt = PaddedBoxes(batch.boxes.to(proposals.dtype), batch.valid)
    matcher = heads.proposal_matcher
    matches = match_padded(matcher, gt, rois)
    index = matches.clamp(min=0)
    labels = batch.labels.gather(1, index).masked_fill(matches == matcher.BELOW_LOW_THRESHOLD, 0)
    drawable = labels.masked_fill((matches == matcher.BETWEEN_THRESHOLDS) | ~rois.valid, -1)
    positive, negative = heads.fg_bg_sampler(drawable)
    rank = positive.to(torch.uint8) * 2 + negative.to(torch.uint8)
    count = min(heads.fg_bg_sampler.batch_size_per_image, rank.shape[1])
    order = rank.sort(dim=1, descending=True, stable=True).indices[:, :count]
    boxes = gather_boxes(rois.boxes, order)
    index = index.gather(1, order)
    valid = (positive | negative).gather(1, order)
    targets = heads.box_coder.encode_single(gather_boxes(gt.boxes, index).flatten(0, 1), boxes.flatten(0, 1))
    labels = labels.gather(1, order).masked_fill(~valid, 0)
    return _Samples(boxes, valid, labels, index, targets.view_as(boxes), positive.sum(dim=1))


def _pool(pooler: nn.Module, features: dict[str, Tensor], boxes: Tensor, image_size: Sequence[int]) -> Tensor:
    """`MultiScaleRoIAlign` of [N, R, 4] boxes, every box pooled from every level and its own level's result
    kept: [N * R, C, h, w]. The scales come from the fixed image size (no host reads)."""
    maps = [features[name] for name in pooler.featmap_names]
    scales = [2.0 ** round(math.log2(m.shape[-2] / image_size[0])) for m in maps]
    rois = torch.cat(
        (
            torch.arange(boxes.shape[0], device=boxes.device, dtype=boxes.dtype).repeat_interleave(
                boxes.shape[1], output_size=boxes.shape[0] * boxes.shape[1]
            )[:, None],
            boxes.flatten(0, 1),
        ),
        dim=1,
    )
    aligned = bool(getattr(pooler, "aligned", False))
    output_size = pooler.output_size
    pooled = None
    levels = None
    if len(maps) > 1:
        # detectron2's level rule where the pooler takes it (`MultiScaleRoIAlign(epsilon_inside_log=True)`).
        rule = EpsilonInsideLogLevelMapper if getattr(pooler, "epsilon_inside_log", False) else LevelMapper
        mapper = rule(
            int(-math.log2(scales[0])), int(-math.log2(scales[-1])),
            canonical_scale=pooler.canonical_scale, canonical_level=pooler.canonical_level,
        )  # fmt: skip
        levels = mapper([boxes.flatten(0, 1)])
    for level, (feature, scale) in enumerate(zip(maps, scales)):
        on_level = roi_align(
            feature, rois.to(feature.dtype), output_size, scale, pooler.sampling_ratio, aligned
        ).to(maps[0].dtype)
        if pooled is None:
            pooled = on_level
        else:
            pooled = torch.where((levels == level)[:, None, None, None], on_level, pooled)
    return pooled


def _box_losses(
    heads: nn.Module, features: dict[str, Tensor], samples: _Samples, image_size: Sequence[int]
) -> dict[str, Tensor]:
    """``loss_classifier`` (softmax cross-entropy) and ``loss_box_reg`` of the valid sampled RoIs, each
    divided by their number (the dynamic path's means)."""
    pooled = _pool(heads.box_roi_pool, features, samples.boxes, image_size)
    class_logits, box_regression = heads.box_predictor(heads.box_head(pooled))
    valid = samples.valid.flatten()
    num_valid = valid.sum().clamp(min=1)
    labels = samples.labels.flatten()
    per_roi = F.cross_entropy(class_logits, labels, reduction="none")
    loss_classifier = per_roi.masked_fill(~valid, 0.0).sum() / num_valid
    targets = samples.regression_targets.flatten(0, 1)
    loss_box_reg = box_regression_loss(box_regression, labels, targets, normalizer=num_valid)
    return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}


def _mask_loss(
    heads: nn.Module,
    features: dict[str, Tensor],
    samples: _Samples,
    batch: FixedBatch,
    capacity: int,
    image_size: Sequence[int],
) -> tuple[Tensor, Tensor]:
    """``loss_mask`` on at most `capacity` foreground RoIs per image, and how many were left out."""
    num_images, num_sampled = samples.valid.shape
    capacity = min(capacity, num_sampled)
    foreground = torch.arange(num_sampled, device=samples.valid.device) < samples.num_foreground[:, None]
    # Beyond the capacity, a uniform subsample of the foreground (the sampler drew them uniformly), kept in
    # their order; below it every foreground row is chosen, first.
    keys = torch.randint(0, 2**31 - 1, foreground.shape, dtype=torch.int32, device=foreground.device)
    chosen = keys.masked_fill(~foreground, -1).topk(capacity, dim=1).indices.sort(dim=1).values
    valid = foreground.gather(1, chosen)
    dropped = (samples.num_foreground - capacity).clamp(min=0).sum()
    boxes = gather_boxes(samples.boxes, chosen)
    index = samples.index.gather(1, chosen)
    labels = samples.labels.gather(1, chosen).flatten()
    pooled = _pool(heads.mask_roi_pool, features, boxes, image_size)
    logits = heads.mask_predictor(heads.mask_head(pooled), labels)[:, 0]
    size = logits.shape[-1]
    masks = batch.masks
    flat_masks = masks.flatten(0, 1)[:, None].to(boxes.dtype)
    image_of_row = torch.arange(num_images, device=index.device)[:, None] * masks.shape[1]
    rois = torch.cat(((index + image_of_row).flatten()[:, None].to(boxes.dtype), boxes.flatten(0, 1)), dim=1)
    targets = roi_align(flat_masks, rois, (size, size), 1.0)[:, 0]
    per_pixel = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")
    valid = valid.flatten()
    num_pixels = (valid.sum() * (size * size)).clamp(min=1)
    loss = per_pixel.masked_fill(~valid[:, None, None], 0.0).sum() / num_pixels
    return loss, dropped
