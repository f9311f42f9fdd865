"""Build models from the recipes and make tiny synthetic mapper outputs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lazytrain.config import LazyConfig, instantiate
from lazytrain.modeling.export import MIN_EXPORT_TORCH

_TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
# torch.export targets (model.pt2, ONNX, AOTInductor) need torch 2.14; the floor environment (2.11) runs the
# other export tests (TorchScript, the wrapper, the version check).
needs_torch_export = pytest.mark.skipif(
    _TORCH < MIN_EXPORT_TORCH, reason=f"torch.export targets need torch >= {MIN_EXPORT_TORCH}"
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "models"
CPU_RECIPE = str(RECIPES / "mask_rcnn_r18_fpn_cpu.py")
R50_RECIPE = str(RECIPES / "mask_rcnn_fpn.py")


def load_model_config(recipe: str = CPU_RECIPE, overrides: tuple[str, ...] = ()):
    cfg = LazyConfig.load(recipe)
    LazyConfig.apply_overrides(cfg, list(overrides))
    return cfg


def build_model(recipe: str = CPU_RECIPE, overrides: tuple[str, ...] = ("model.num_classes=3",)):
    return instantiate(load_model_config(recipe, overrides).model)


def make_record(
    height: int, width: int, *, seed: int = 0, num_classes: int = 3, original_scale: float = 1.0
) -> dict:
    """A mapper output: textured background with 2 filled rectangles of class-specific colours."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 60, (3, height, width), generator=generator, dtype=torch.uint8)
    boxes, classes, masks = [], [], []
    for index in range(2):
        h = int(torch.randint(height // 4, height // 2, (1,), generator=generator))
        w = int(torch.randint(width // 4, width // 2, (1,), generator=generator))
        y0 = int(torch.randint(0, height - h, (1,), generator=generator))
        x0 = int(torch.randint(0, width - w, (1,), generator=generator))
        category = (seed + index) % num_classes
        mask = torch.zeros(height, width, dtype=torch.uint8)
        mask[y0 : y0 + h, x0 : x0 + w] = 1
        colour = torch.tensor(
            [255 * (category == 0), 255 * (category == 1), 255 * (category == 2)], dtype=torch.uint8
        )
        image[:, mask.bool()] = colour[:, None]
        boxes.append([x0, y0, x0 + w, y0 + h])
        classes.append(category)
        masks.append(mask)
    return {
        "image": image,
        "instances": {
            "boxes": torch.tensor(boxes, dtype=torch.float32),
            "classes": torch.tensor(classes, dtype=torch.int64),
            "masks": torch.stack(masks),
        },
        "height": round(height * original_scale),
        "width": round(width * original_scale),
        "image_id": seed,
        "file_name": f"{seed}.png",
    }


@contextlib.contextmanager
def log_messages(name: str) -> Iterator[list[str]]:
    """Messages logged at INFO and above by logger `name` inside the block, whether or not the library
    logger propagates to the root (the default program's `default_setup` stops it)."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
