"""Mask R-CNN R50-FPN built as detectron2 builds it, for detectron2's checkpoints (``train.init_checkpoint=
model_final_*.pkl``, converted by `lazytrain.modeling.detectron2_weights`): the same detections.

Every option below is a documented key of a lazytrain part, whose default is torchvision's:
- the MSRA ResNet downsamples in the 1x1 conv (``backbone.stride_in_1x1``);
- anchors unrounded, with strides 4-64 (``rpn.anchor_generator.round_cell_anchors``/``strides``);
- proposals: only empty boxes dropped (``rpn.min_size=0``, ``rpn.strict_min_size``);
- RoIAlignV2 with the adaptive sample grid and detectron2's level rule (``aligned``, ``sampling_ratio=0``,
  ``epsilon_inside_log`` of both poolers);
- detections: no minimum size, empty boxes dropped after the scaling to the original size
  (``roi_heads.detection_min_size=0``, ``drop_empty_detections``), masks pasted by ``grid_sample`` over the
  continuous box and thresholded at >= 0.5 (``mask_paste``);
- pixel mean: detectron2's (RGB order; the converter flips conv1 to RGB), std 1.
The test sizes (800/1333) are the data recipe's; ``conf/detectron2_*.py`` set them with the score threshold.
Faster R-CNN: ``~model.roi_heads.mask_roi_pool ~model.roi_heads.mask_head ~model.roi_heads.mask_predictor``.
"""

from lazytrain.config import LazyCall as L
from lazytrain.modeling.mask_paste import GridSampleMaskPaste
from lazytrain.modeling.detectron2_weights import DETECTRON2_PIXEL_MEAN_RGB

from .mask_rcnn_fpn import model

model.backbone.stride_in_1x1 = True
model.rpn.anchor_generator.round_cell_anchors = False
model.rpn.anchor_generator.strides = [4, 8, 16, 32, 64]
model.rpn.pre_nms_top_n = dict(training=2000, testing=1000)
model.rpn.post_nms_top_n = dict(training=1000, testing=1000)
model.rpn.min_size = 0.0
model.rpn.strict_min_size = True
for pool in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool):
    pool.sampling_ratio = 0
    pool.aligned = True
    pool.epsilon_inside_log = True
model.roi_heads.detection_min_size = 0.0
model.drop_empty_detections = True
model.mask_paste = L(GridSampleMaskPaste)()
model.pixel_mean = list(DETECTRON2_PIXEL_MEAN_RGB)
model.pixel_std = [1.0, 1.0, 1.0]
