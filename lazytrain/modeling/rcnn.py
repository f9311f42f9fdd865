"""`RCNN`: torchvision's two-stage detectors (Faster/Mask R-CNN) speaking lazytrain's data format.

Input is the mapper's list of dicts (uint8 CHW images already augmented and resized, ``instances`` in
training); output is a loss dict in training and, in eval, one ``{"instances": ...}`` per image in the
ORIGINAL image size (``height``/``width`` of the record). See docs/architecture.md for the contract.
`RCNN.detect` is the eval path before that mapping (detections in the input image's pixels); exports
(`lazytrain.modeling.export`) trace it.

Images are resized once, by the mapper: `NoResizeTransform` (`lazytrain.modeling.image_batch`) only normalises
and pads, so the backbone sees each image at exactly the mapper's size. `RCNN.compile_backbone` runs the
backbone through ``torch.compile`` in training (`lazytrain.modeling.compiled_backbone`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork
from torchvision.ops import boxes as box_ops

from lazytrain.modeling import roi_heads as lazytrain_roi_heads
from lazytrain.modeling.backbone import get_feature_map_names
from lazytrain.modeling.classification_losses import SoftmaxCrossEntropy
from lazytrain.modeling.compiled_backbone import CompiledBackbone
from lazytrain.modeling.fixed_shapes import (
    FixedBatch,
    FixedShapeCounters,
    FixedShapes,
    check_model,
    fixed_shape_losses,
    pad_batch,
)
from lazytrain.modeling.host_values import to_device
from lazytrain.modeling.image_batch import IMAGENET_PIXEL_MEAN, IMAGENET_PIXEL_STD, NoResizeTransform
from lazytrain.modeling.mask_paste import GridSampleMaskPaste, TorchvisionMaskPaste
from lazytrain.utils.logger import log_first_n

__all__ = ["RCNN"]

logger = logging.getLogger(__name__)


def _check_stats(name: str, values: Sequence[float]) -> list[float]:
    values = [float(v) for v in values]
    if len(values) != 3 or (name == "pixel_std" and min(values) <= 0):
        raise ValueError(
            f"RCNN({name}=) must be 3 per-channel values (std > 0) on the 0-255 scale; got {values}"
        )
    return values


class RCNN(GeneralizedRCNN):
    """A torchvision `GeneralizedRCNN` that takes mapper dicts and returns results in the original size.

    Sub-modules keep torchvision's names (``backbone``, ``rpn``, ``roi_heads``), so a config overrides e.g.
    ``model.roi_heads.detections_per_img=300`` and torchvision Mask R-CNN checkpoints load key for key.
    To wrap a model built by torchvision (``maskrcnn_resnet50_fpn(...)``) use `RCNN.from_torchvision`.

    Images are converted to float on the 0-255 scale and normalised with `pixel_mean`/`pixel_std` (also
    0-255 scale, RGB); no resize happens inside the model, the mapper decides the size.

    Args:
        backbone: returns an ordered dict of feature maps and has an ``out_channels`` attribute.
        rpn: torchvision `RegionProposalNetwork` (anchor generator + head).
        roi_heads: `lazytrain.modeling.RoIHeads` (or torchvision's, which trains with softmax cross-entropy
            only); a mask head and predictor make it Mask R-CNN.
        num_classes: number of foreground classes, checked against the box (and mask) predictor.
        pixel_mean: per-channel RGB mean on the 0-255 scale.
        pixel_std: per-channel RGB std on the 0-255 scale.
        size_divisible: padding multiple of the batched image tensor.
        mask_threshold: mask probability above which a pixel belongs to the instance in eval outputs.
        channels_last: keep conv weights and the image batch in channels-last (NHWC) memory format, which
            oneDNN convolutions on CPU (and tensor cores on GPU) run faster; numbers differ from NCHW only
            by float rounding, and checkpoints load either way. None (the default): channels-last while the
            model is on a GPU (or any device but the CPU), NCHW on the CPU, switched whenever the model moves
            (``model.to(device)``, before an optimizer or DDP sees it); docs/benchmarks.md has the gain.
        pad_to_sizes: training batches padded to the smallest of these [height, width] sizes that holds them
            (see `NoResizeTransform`), for `compile_backbone`; evaluation pads by `size_divisible` as always.
        fixed_shapes: train with every tensor's shape fixed (`lazytrain.modeling.fixed_shapes`: padded images,
            ground truth, proposals, sampled RoIs, mask positives; no host syncs; `fixed_step` compiles whole).
            None (the default): the dynamic step. Evaluation is unchanged.
        mask_paste: how eval outputs paste and threshold the mask probabilities (`lazytrain.modeling.mask_paste`):
            `TorchvisionMaskPaste` (None, the default) or `GridSampleMaskPaste` (detectron2's rule).
        drop_empty_detections: in `forward`'s eval outputs, drop detections whose box, scaled to the original
            size and clipped, has no width or height (detectron2's postprocessing; they still took a place
            among the ``detections_per_img``).
    """

    def __init__(
        self,
        backbone: nn.Module,
        rpn: RegionProposalNetwork,
        roi_heads: RoIHeads,
        *,
        num_classes: int | None = None,
        pixel_mean: Sequence[float] = IMAGENET_PIXEL_MEAN,
        pixel_std: Sequence[float] = IMAGENET_PIXEL_STD,
        size_divisible: int = 32,
        mask_threshold: float = 0.5,
        channels_last: bool | None = None,
        pad_to_sizes: Sequence[Sequence[int]] | None = None,
        fixed_shapes: FixedShapes | None = None,
        mask_paste: TorchvisionMaskPaste | GridSampleMaskPaste | None = None,
        drop_empty_detections: bool = False,
    ) -> None:
        transform = NoResizeTransform(
            _check_stats("pixel_mean", pixel_mean),
            _check_stats("pixel_std", pixel_std),
            size_divisible,
            pad_to_sizes,
        )
        super().__init__(backbone, rpn, roi_heads, transform)
        self.num_classes = self._check_num_classes(num_classes)
        self._check_classification_loss()
        self.mask_threshold = float(mask_threshold)
        self.mask_paste = TorchvisionMaskPaste() if mask_paste is None else mask_paste
        self.drop_empty_detections = bool(drop_empty_detections)
        self._check_feature_maps()
        self.channels_last = channels_last
        self.memory_format = torch.contiguous_format
        self._follow_memory_format()
        self.compiled_backbone: CompiledBackbone | None = None
        self.fixed_shapes = fixed_shapes
        if fixed_shapes is not None:
            check_model(self)
        # The fixed-shape steps' `FixedShapeCounters`, summed on the device (reading them is a host sync).
        self.fixed_shape_counters: FixedShapeCounters | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> RCNN:
        # Every move and cast (`to`, `cuda`, `cpu`, `half`, ...) ends here: channels_last=None follows the device.
        super()._apply(fn, recurse)
        if hasattr(self, "channels_last"):  # not during __init__
            self._follow_memory_format()
        return self

    def _follow_memory_format(self) -> None:
        wanted = self.channels_last
        if wanted is None:
            parameter = next(self.parameters(), None)
            wanted = parameter is not None and parameter.device.type != "cpu"
        memory_format = torch.channels_last if wanted else torch.contiguous_format
        if memory_format != self.memory_format:
            self.memory_format = memory_format
            super()._apply(lambda t: t.contiguous(memory_format=memory_format) if t.dim() == 4 else t)

    @classmethod
    def from_torchvision(
        cls,
        model: GeneralizedRCNN,
        *,
        pixel_mean: Sequence[float] | None = None,
        pixel_std: Sequence[float] | None = None,
        channels_last: bool | None = None,
    ) -> RCNN:
        """Wrap a torchvision Faster/Mask R-CNN, sharing its modules and replacing its resizing transform.

        Args:
            model: e.g. ``torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None)``.
            pixel_mean: 0-255 scale; default: the model's own (0-1 scale) mean times 255.
            pixel_std: 0-255 scale; default: the model's own std times 255.
            channels_last: see the class arguments.
        """
        transform = model.transform
        if pixel_mean is None:
            pixel_mean = [255.0 * v for v in transform.image_mean]
        if pixel_std is None:
            pixel_std = [255.0 * v for v in transform.image_std]
        return cls(
            model.backbone, model.rpn, model.roi_heads, pixel_mean=pixel_mean, pixel_std=pixel_std,
            size_divisible=transform.size_divisible, channels_last=channels_last,
        )  # fmt: skip

    def compile_backbone(self, *, mode: str | None = None, backend: str = "inductor") -> None:
        """Run the backbone (with its FPN) through ``torch.compile`` in training steps (a regional compile:
        the RPN and RoI heads, with their data-dependent shapes, stay eager; so does evaluation).

        Compiled graphs are for fixed shapes (``dynamic=False``): the first training batch's shape is
        compiled, and a batch of another shape raises a ValueError instead of compiling again, unless
        `pad_to_sizes` allows it (one shape per size). With large-scale jitter, pad every batch to its size
        (``model.pad_to_sizes=[[1024,1024]]``); with multi-scale resizing, to a few buckets.

        Args:
            mode: ``torch.compile``'s mode: None/"default", "reduce-overhead" (CUDA graphs on a GPU),
                "max-autotune", "max-autotune-no-cudagraphs".
            backend: ``torch.compile``'s backend ("inductor"; "aot_eager" traces without generating code).
        """
        self.compiled_backbone = CompiledBackbone(mode=mode, backend=backend)

    def _backbone_for(self, batch: Tensor) -> nn.Module:
        """The backbone to run `batch` through: compiled in training after `compile_backbone`, else eager."""
        if self.compiled_backbone is None or not self.training or torch.compiler.is_compiling():
            return self.backbone
        max_shapes = max(len(self.transform.pad_to_sizes), 1)
        return self.compiled_backbone.for_batch(self.backbone, batch, max_shapes)

    def _check_num_classes(self, num_classes: int | None) -> int:
        predictors = self.roi_heads.box_predictor
        # CascadeRoIHeads keeps one predictor per stage in a ModuleList.
        predictors = list(predictors) if isinstance(predictors, nn.ModuleList) else [predictors]
        found = num_classes
        for predictor in predictors:
            found = predictor.cls_score.out_features - 1 if hasattr(predictor, "cls_score") else num_classes
            if num_classes is not None and found != num_classes:
                raise ValueError(
                    f"RCNN(num_classes={num_classes}) disagrees with roi_heads.box_predictor, which predicts "
                    f"{found} foreground classes. Set the predictors' num_classes from the same key "
                    "(e.g. num_classes='${...num_classes}')."
                )
        mask_predictor = self.roi_heads.mask_predictor
        logits = getattr(mask_predictor, "mask_fcn_logits", None)
        if logits is not None and found is not None and logits.out_channels - 1 != found:
            raise ValueError(
                f"RCNN: roi_heads.mask_predictor predicts {logits.out_channels - 1} foreground classes but "
                f"the box predictor {found}; give both the same num_classes."
            )
        return found

    def _check_classification_loss(self) -> None:
        loss = getattr(self.roi_heads.box_predictor, "loss", None)
        if loss is None or isinstance(loss, SoftmaxCrossEntropy):
            return
        if not isinstance(self.roi_heads, lazytrain_roi_heads.RoIHeads):
            raise ValueError(
                f"RCNN: roi_heads.box_predictor.loss is {type(loss).__name__}, but roi_heads is "
                f"{type(self.roi_heads).__module__}.{type(self.roi_heads).__name__}, which always trains with "
                "softmax cross-entropy and scores with a softmax. Build roi_heads with "
                "lazytrain.modeling.RoIHeads (same arguments)."
            )

    def _check_feature_maps(self) -> None:
        anchors = self.rpn.anchor_generator
        per_location = set(anchors.num_anchors_per_location())
        head_anchors = getattr(getattr(self.rpn.head, "cls_logits", None), "out_channels", None)
        if head_anchors is not None and per_location != {head_anchors}:
            raise ValueError(
                f"RCNN: the anchor generator places {sorted(per_location)} anchors per location but "
                f"rpn.head predicts {head_anchors}; set rpn.head.num_anchors to len(sizes per level) * "
                "len(aspect_ratios per level)."
            )
        names = get_feature_map_names(self.backbone)
        if names is None:
            return
        if len(anchors.sizes) != len(names):
            raise ValueError(
                f"RCNN: the backbone returns {len(names)} feature maps {names} but the anchor generator has "
                f"{len(anchors.sizes)} size groups {list(anchors.sizes)}; give one size group per map."
            )
        for pool_name in ("box_roi_pool", "mask_roi_pool"):
            pool = getattr(self.roi_heads, pool_name, None)
            missing = set(getattr(pool, "featmap_names", [])) - set(names)
            if missing:
                raise ValueError(
                    f"RCNN: roi_heads.{pool_name}.featmap_names refers to {sorted(missing)}, which the backbone "
                    f"does not return (it returns {names})."
                )

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, batched_inputs: list[dict[str, Any]]) -> dict[str, Tensor] | list[dict[str, Any]]:
        """Run the detector on a batch of mapper outputs.

        Args:
            batched_inputs: one dict per image with ``image`` (uint8 [3, H, W] RGB), in training
                ``instances`` (``boxes`` XYXY, ``classes`` contiguous 0..K-1, ``masks`` for Mask R-CNN),
                and optionally the original ``height``/``width``.

        Returns:
            In training, a dict of scalar losses. In eval, per image ``{"instances": {"boxes", "scores",
            "classes", "masks"}}`` at the original ``height`` x ``width`` (``masks`` only for Mask R-CNN,
            uint8 0/1).
        """
        device = self.device
        if self.training and self.fixed_shapes is not None:
            batch = pad_batch(
                batched_inputs,
                self.fixed_shapes,
                device,
                self.roi_heads.has_mask(),
                size_divisible=self.transform.size_divisible,
            )
            losses, counters = self.fixed_step(batch)
            totals = self.fixed_shape_counters
            self.fixed_shape_counters = (
                counters if totals is None else FixedShapeCounters(*(a + b for a, b in zip(totals, counters)))
            )
            return losses
        images = [self._to_device_image(record, device) for record in batched_inputs]
        if self.training:
            targets = [self._to_target(record, device) for record in batched_inputs]
            return self._run_backbone_and_heads(images, targets)[1]
        return [
            {"instances": self._to_original_size(detection, tuple(image.shape[-2:]), record)}
            for detection, image, record in zip(self.detect(images), images, batched_inputs)
        ]

    def fixed_step(self, batch: FixedBatch) -> tuple[dict[str, Tensor], FixedShapeCounters]:
        """The training losses of a `FixedBatch` at fixed shapes and the step's counters
        (`lazytrain.modeling.fixed_shapes.fixed_shape_losses`): no host syncs, and ``torch.compile(model.fixed_step,
        fullgraph=True)`` traces it whole."""
        if self.fixed_shapes is None:
            raise ValueError("RCNN.fixed_step needs model.fixed_shapes (a FixedShapes); it is None.")
        return fixed_shape_losses(self, batch, self.fixed_shapes)

    def detect(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        """Eval-mode detections in the coordinates of the images given (no mapping to an original size).

        `forward` maps these to each record's ``height``/``width``; `lazytrain.modeling.export` traces this
        path (with `to_instances`) so that the exported graph is the model's own inference.

        Args:
            images: [3, H, W] RGB on the 0-255 scale, uint8 or float, on the model's device.

        Returns:
            Per image torchvision's detection dict: ``boxes`` [N, 4] XYXY clipped to the image, ``scores``
            [N], ``labels`` [N] in 1..K (0 is the background) and, for Mask R-CNN, ``masks`` [N, 1, M, M]
            mask probabilities inside each box (M: the mask head's resolution).
        """
        if self.training:
            raise ValueError(
                "RCNN.detect() runs the inference path and needs the model in eval mode; got a model in "
                "training mode. Call model.eval() first."
            )
        return self._run_backbone_and_heads(images, None)[0]

    def to_instances(self, detection: dict[str, Tensor], image_size: tuple[int, int]) -> dict[str, Tensor]:
        """One image's `detect` output, with boxes already in the pixels of `image_size`, as lazytrain
        instances: ``classes`` 0..K-1 and, for Mask R-CNN, ``masks`` uint8 0/1 [N, height, width] pasted at
        `image_size` and thresholded at `mask_threshold` (by `mask_paste`).

        Args:
            detection: ``boxes``, ``scores``, ``labels`` (1..K) and optionally ``masks`` [N, 1, M, M].
            image_size: (height, width) of the image the boxes are in, where the masks are pasted.
        """
        instances = {
            "boxes": detection["boxes"],
            "scores": detection["scores"],
            "classes": detection["labels"] - 1,
        }
        if "masks" in detection:
            # Pasting the small mask probabilities straight at the output size avoids a second resampling.
            masks = self.mask_paste(detection["masks"], detection["boxes"], image_size, self.mask_threshold)
            instances["masks"] = masks.to(torch.uint8)
        return instances

    def _run_backbone_and_heads(
        self, images: list[Tensor], targets: list[dict[str, Tensor]] | None
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """Normalise and batch, then backbone, RPN and RoI heads: (detections, losses); in training the
        detections are empty, in eval the losses."""
        if torch.compiler.is_exporting() or torch.jit.is_tracing():
            # torchvision's per-image path, which keeps an exported program's image sizes symbolic.
            image_list, targets = self.transform(images, targets)
            batch = image_list.tensors.contiguous(memory_format=self.memory_format)
        else:
            image_list = self.transform.normalized_batch(images, self.memory_format)
            batch = image_list.tensors
        features = self._backbone_for(batch)(batch)
        if isinstance(features, Tensor):
            features = OrderedDict([("0", features)])
        proposals, proposal_losses = self.rpn(image_list, features, targets)
        detections, detector_losses = self.roi_heads(features, proposals, image_list.image_sizes, targets)
        return detections, {**detector_losses, **proposal_losses}

    @staticmethod
    def _to_device_image(record: Mapping[str, Any], device: torch.device) -> Tensor:
        image = record["image"]
        if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[0] != 3:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ValueError(f"RCNN: 'image' must be a [3, H, W] RGB tensor (uint8, 0-255); got {shape}")
        # Copied as it is (uint8: a quarter of float32's bytes); `NoResizeTransform.normalized_batch` converts.
        return image.to(device, non_blocking=True)

    def _to_target(self, record: Mapping[str, Any], device: torch.device) -> dict[str, Tensor]:
        instances = record.get("instances")
        if instances is None:
            raise ValueError(
                "RCNN: training inputs need 'instances' (boxes, classes[, masks]); the mapper must be built "
                "with is_train=True."
            )
        boxes = torch.as_tensor(instances["boxes"], dtype=torch.float32).reshape(-1, 4)
        target = {"boxes": boxes, "labels": torch.as_tensor(instances["classes"])}
        if self.roi_heads.has_mask():
            if "masks" not in instances:
                raise ValueError(
                    "RCNN: this model has a mask head but 'instances' has no 'masks'; build the mapper with "
                    "use_instance_mask=True (or drop the mask head)."
                )
            target["masks"] = torch.as_tensor(instances["masks"])
        # torchvision rejects empty boxes; augmentations (crops) can produce them. Checked where the loader
        # put the boxes (host memory), so that reading the answer does not wait for the GPU.
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        if not bool(keep.all()):
            log_first_n(
                logging.WARNING, "RCNN: dropped ground-truth boxes with zero width or height.", name=__name__
            )
            target = {key: value[keep] for key, value in target.items()}
        # From pinned memory (`build_detection_train_loader(pin_memory=...)`) these copies run alongside the
        # GPU's work; from pageable memory they are ordinary copies. On the CPU they return the tensors as is.
        target = {key: value.to(device, non_blocking=True) for key, value in target.items()}
        target["labels"] = (
            target["labels"].long() + 1
        )  # on the device: the copy stays from the loader's memory
        return target

    def _to_original_size(
        self, detection: dict[str, Tensor], input_size: tuple[int, int], record: Mapping[str, Any]
    ) -> dict[str, Tensor]:
        height = int(record.get("height", input_size[0]))
        width = int(record.get("width", input_size[1]))
        scale = [width / input_size[1], height / input_size[0]] * 2
        scale = to_device(scale, detection["boxes"].device, detection["boxes"].dtype)
        boxes = box_ops.clip_boxes_to_image(detection["boxes"] * scale, (height, width))
        detection = {**detection, "boxes": boxes}
        if self.drop_empty_detections:
            keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            detection = {key: value[keep] for key, value in detection.items()}
        return self.to_instances(detection, (height, width))
