"""The CPU recipe model trained a few steps on a tiny synthetic_lt, then evaluated with the LVIS protocol."""

import math

import pytest
import torch

from lazytrain.data.build import build_detection_test_loader, build_detection_train_loader
from lazytrain.data.catalog import MetadataCatalog
from lazytrain.data.datasets.lvis import load_lvis_json
from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from lazytrain.data.mappers import DatasetMapper
from lazytrain.data.transforms import ResizeShortestEdge
from lazytrain.evaluation import LVISEvaluator, inference_on_dataset
from tests.modeling.helpers import build_model


@pytest.fixture
def tiny_synthetic_lt(tmp_path):
    root = generate_synthetic_lt(
        str(tmp_path / "synthetic_lt"),
        num_train=16,
        num_val=6,
        size_range=(96, 128),
        val_images_per_category=1,
    )
    yield {
        split: load_lvis_json(f"{root}/lvis_v1_{split}.json", root, f"e2e_{split}")
        for split in ("train", "val")
    }
    for split in ("train", "val"):
        MetadataCatalog.remove(f"e2e_{split}")


def test_train_a_few_steps_then_evaluate(tiny_synthetic_lt, tmp_path):
    torch.manual_seed(0)
    model = build_model(overrides=("model.num_classes=30",))
    train_loader = build_detection_train_loader(
        tiny_synthetic_lt["train"],
        mapper=DatasetMapper(
            is_train=True, augmentations=[ResizeShortestEdge(short_edge_length=128, max_size=160)]
        ),
        total_batch_size=2,
        aspect_ratio_grouping=False,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    totals = []
    for _, batch in zip(range(8), train_loader):
        losses = model(batch)
        total = sum(losses.values())
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(float(total.detach()))
    assert all(math.isfinite(t) for t in totals)
    assert sum(totals[-3:]) < sum(totals[:3]), totals

    # Evaluate at a different size than the originals: outputs must come back in the original size.
    test_loader = build_detection_test_loader(
        tiny_synthetic_lt["val"],
        mapper=DatasetMapper(
            is_train=False, augmentations=[ResizeShortestEdge(short_edge_length=64, max_size=96)]
        ),
    )
    model.roi_heads.score_thresh = 0.0  # an 8-step model is unsure of everything
    evaluator = LVISEvaluator("e2e_val", output_dir=str(tmp_path / "eval"))
    results = inference_on_dataset(model, test_loader, evaluator)
    assert model.training
    assert set(results) == {"bbox", "segm"}
    for metrics in results.values():
        assert set(metrics) == {"AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf"}
        assert 0 <= metrics["AP"] <= 100
    assert (tmp_path / "eval" / "lvis_per_category_ap.csv").is_file()
