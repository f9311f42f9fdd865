"""Your own COCO- or LVIS-format export: the LVIS recipe's loaders, mapper and RFS sampler, reading the files
named under ``data`` (registered by every process that builds a loader, so spawned ranks and sweep jobs see
them), evaluated by `LongTailEvaluator` (AP with APr/APc/APf; LVIS's federated protocol when the val json
lists ``neg_category_ids``, COCO's exhaustive one otherwise).

    data.train.json=PATH data.train.images=DIR data.val.json=PATH data.val.images=DIR
    data.frequency_thresholds=[10,100]   r/c/f limits in train images when the json has no LVIS 'frequency'
                                         (fractions of the train images when below 1, e.g. [0.01,0.1])

The RFS threshold is derived from the train json, ``100 / train images with annotations`` (LVIS's 0.001 at
~100k images); set ``dataloader.train.sampler.repeat_thresh`` to choose another (scripts/dataset_stats.py).
"""

from lazytrain.config import LazyCall as L
from lazytrain.data.datasets.custom import register_json_dataset
from lazytrain.evaluation import LongTailEvaluator

from .lvis_v1 import dataloader

data = dict(
    train=dict(json="???", images="???"),
    val=dict(json="???", images="???"),
    frequency_thresholds=[10, 100],
)

dataloader.train.dataset.names = L(register_json_dataset)(
    name="custom_train",
    json_file="${data.train.json}",
    image_root="${data.train.images}",
    frequency_thresholds="${data.frequency_thresholds}",
)
dataloader.train.sampler.repeat_thresh = "${lazytrain.json_repeat_thresh:${data.train.json}}"
dataloader.test.dataset.names = L(register_json_dataset)(
    name="custom_val",
    json_file="${data.val.json}",
    image_root="${data.val.images}",
    train_json_file="${data.train.json}",
    frequency_thresholds="${data.frequency_thresholds}",
)
dataloader.evaluator = L(LongTailEvaluator)(
    dataset_name="${..test.dataset.names}", output_dir="${train.output_dir}"
)
