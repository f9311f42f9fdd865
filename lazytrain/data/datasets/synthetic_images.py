"""How one `synthetic_lt` image is drawn: shapes, their placement, the background and each instance's annotation.

Each shape is a union of convex parts (a star is a pentagon and five triangles, a cross three boxes), so with
occlusion the visible region of an instance is computed exactly by clipping its convex parts against the convex
parts of the shapes drawn over it (`_subtract`); its segmentation is the resulting list of convex polygons
(their union is the visible region, matching the pixels up to rasterization). Unoccluded instances have their
outline as one polygon. Instances are drawn in order, later ones on top, and a placement is rejected when it
would leave an earlier instance less than half visible; without occlusion, when its bounding box meets an
earlier one's. `lazytrain.data.datasets.synthetic` plans the data set and writes it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["COLORS", "SHAPES", "draw_image"]

logger = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "star", "cross", "hexagon")
COLORS = {
    "red": (215, 45, 40),
    "green": (45, 170, 70),
    "blue": (50, 85, 215),
    "yellow": (235, 205, 45),
    "magenta": (195, 55, 195),
}
"""Category json id c (from 1) is colour ``(c - 1) % 5`` and shape ``(c - 1) // 5``."""
_MIN_VISIBLE_FRACTION = 0.5

Polygon = list[tuple[float, float]]


# ---------------------------------------------------------------------------------------------- geometry
def _regular(count: int, radius: float = 1.0, phase: float = -math.pi / 2) -> Polygon:
    return [
        (
            radius * math.cos(phase + 2 * math.pi * k / count),
            radius * math.sin(phase + 2 * math.pi * k / count),
        )
        for k in range(count)
    ]


def _box(x0: float, y0: float, x1: float, y1: float) -> Polygon:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _unit_shape(shape: str) -> tuple[Polygon, list[Polygon]]:
    """The outline of `shape` (radius about 1, centred at 0) and convex parts that tile it exactly."""
    if shape == "circle":
        outline = _regular(20)
    elif shape == "square":
        outline = _box(-0.7, -0.7, 0.7, 0.7)
    elif shape == "triangle":
        outline = _regular(3)
    elif shape == "hexagon":
        outline = _regular(6, phase=0.0)
    elif shape == "star":
        tips, inner = _regular(5), _regular(5, 0.45, -math.pi / 2 + math.pi / 5)
        outline = [point for k in range(5) for point in (tips[k], inner[k])]
        return outline, [inner] + [[inner[k - 1], tips[k], inner[k]] for k in range(5)]
    else:  # cross
        a, b = 0.28, 0.95
        outline = [
            (-a, -b),
            (a, -b),
            (a, -a),
            (b, -a),
            (b, a),
            (a, a),
            (a, b),
            (-a, b),
            (-a, a),
            (-b, a),
            (-b, -a),
            (-a, -a),
        ]
        return outline, [_box(-a, -b, a, b), _box(-b, -a, -a, a), _box(a, -a, b, a)]
    return outline, [outline]


def _area(polygon: Polygon) -> float:
    """Signed shoelace area (positive for the orientation every unit shape above uses)."""
    total = 0.0
    for (x0, y0), (x1, y1) in zip(polygon, polygon[1:] + polygon[:1]):
        total += x0 * y1 - x1 * y0
    return total / 2


def _clip(polygon: Polygon, a: float, b: float, c: float) -> Polygon:
    """The part of a convex polygon where ``a*x + b*y + c >= 0`` (one Sutherland-Hodgman step)."""
    values = [a * x + b * y + c for x, y in polygon]
    out = []
    for i, point in enumerate(polygon):
        j = (i + 1) % len(polygon)
        if values[i] >= 0:
            out.append(point)
        if (values[i] >= 0) != (values[j] >= 0):
            t = values[i] / (values[i] - values[j])
            q = polygon[j]
            out.append((point[0] + t * (q[0] - point[0]), point[1] + t * (q[1] - point[1])))
    return out


def _extent(polygon: Polygon) -> tuple[float, float, float, float]:
    xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
    return min(xs), min(ys), max(xs), max(ys)


def _subtract(piece: Polygon, cutter: Polygon, min_area: float = 0.25) -> list[Polygon]:
    """``piece`` minus ``cutter`` (both convex) as disjoint convex polygons: for each edge of the cutter,
    the part of what is left that lies outside that edge."""
    px0, py0, px1, py1 = _extent(piece)
    cx0, cy0, cx1, cy1 = _extent(cutter)
    if px1 <= cx0 or cx1 <= px0 or py1 <= cy0 or cy1 <= py0:
        return [piece]
    edges = []
    for (x0, y0), (x1, y1) in zip(cutter, cutter[1:] + cutter[:1]):
        a, b = y0 - y1, x1 - x0  # inside the cutter: a*x + b*y + c >= 0
        edges.append((a, b, -(a * x0 + b * y0)))
    overlap = piece
    for a, b, c in edges:
        overlap = _clip(overlap, a, b, c)
        if len(overlap) < 3 or _area(overlap) <= min_area:
            return [piece]  # (almost) no overlap: keep the piece whole rather than split along the edges
    pieces, remaining = [], piece
    for a, b, c in edges:
        outside = _clip(remaining, -a, -b, -c)
        if len(outside) >= 3 and _area(outside) > min_area:
            pieces.append(outside)
        remaining = _clip(remaining, a, b, c)
        if len(remaining) < 3 or _area(remaining) <= 1e-9:
            break
    return pieces


def _subtract_all(pieces: list[Polygon], cutters: list[Polygon]) -> list[Polygon]:
    """Convex `pieces` minus every convex cutter; the same list object when no cutter overlaps them."""
    for cutter in cutters:
        cut = [q for p in pieces for q in _subtract(p, cutter)]
        if len(cut) != len(pieces) or any(a is not b for a, b in zip(cut, pieces)):
            pieces = cut
    return pieces


class _Instance:
    """One object: its outline (for drawing), its convex parts and the convex pieces still visible."""

    def __init__(self, category: int, outline: Polygon, parts: list[Polygon]) -> None:
        self.category = category
        self.outline = outline
        self.parts = parts
        self.visible = parts
        self.area = sum(_area(p) for p in parts)
        self.occluded = False


def _random_instance(
    rng: np.random.Generator, category: int, width: int, height: int, shrink: float, max_rotation: float
) -> _Instance:
    shape = SHAPES[(category - 1) // len(COLORS)]
    outline, parts = _unit_shape(shape)
    radius = rng.uniform(0.08, 0.22) * min(width, height) * shrink
    cx, cy = rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)
    angle = rng.uniform(0, 2 * math.pi)
    if max_rotation < 180:  # the same draw, mapped into [-max_rotation, max_rotation] degrees
        angle = (angle / math.pi - 1) * math.radians(max_rotation)
    cos, sin = math.cos(angle) * radius, math.sin(angle) * radius

    def place(polygon: Polygon) -> Polygon:
        return [(cx + cos * x - sin * y, cy + sin * x + cos * y) for x, y in polygon]

    return _Instance(category, place(outline), [place(p) for p in parts])


def _overlaps(a: _Instance, b: _Instance) -> bool:
    ax0, ay0, ax1, ay1 = _extent(a.outline)
    bx0, by0, bx1, by1 = _extent(b.outline)
    return ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1


def _place_instances(
    rng: np.random.Generator, categories: Sequence[int], width: int, height: int, style: dict
) -> list[_Instance]:
    """Place instances in drawing order. With `occlusion`, reject positions that would hide more than half of
    an earlier instance; without, reject positions whose bounding box meets an earlier one's."""
    placed: list[_Instance] = []
    for category in categories:
        for attempt in range(40 if style["occlusion"] else 100):  # shrinking: 0.95**100 = 0.6% of the size
            candidate = _random_instance(
                rng, category, width, height, shrink=0.95**attempt, max_rotation=style["max_rotation"]
            )
            if not style["occlusion"]:
                if not any(_overlaps(candidate, earlier) for earlier in placed):
                    placed.append(candidate)
                    break
                continue
            updated = []
            for earlier in placed:
                pieces = _subtract_all(earlier.visible, candidate.parts)
                if sum(_area(p) for p in pieces) < _MIN_VISIBLE_FRACTION * earlier.area:
                    break
                updated.append(pieces)
            else:
                for earlier, pieces in zip(placed, updated):
                    if pieces is not earlier.visible:
                        earlier.occluded, earlier.visible = True, pieces
                placed.append(candidate)
                break
        else:
            logger.debug("synthetic_lt: no room for category %d in a %dx%d image", category, width, height)
    return placed


# --------------------------------------------------------------------------------------------- rendering
def _background(rng: np.random.Generator, width: int, height: int, style: dict) -> Image.Image:
    if style["textured_background"]:  # a random colour and multi-hue texture
        base, channels, amplitude = rng.integers(70, 190, size=3), 3, 28
    else:  # a grey field with a mild tint and a grey texture
        base, channels, amplitude = rng.integers(80, 180) + rng.integers(-10, 11, size=3), 1, 12
    coarse = rng.normal(0, amplitude, size=(max(2, height // 24), max(2, width // 24), channels))
    coarse = np.repeat(coarse, 3 // channels, axis=2)
    coarse_image = Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8))
    texture = np.asarray(coarse_image.resize((width, height), Image.BICUBIC), dtype=np.float32) - 128
    image = Image.fromarray(np.clip(base + texture, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, style["clutter"] + 1))):  # unannotated grey clutter
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.05, 0.2, size=2) * min(width, height)
        grey = int(rng.integers(60, 200))
        draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=(grey, grey, grey))
    return image


def _is_visible_piece(polygon: Polygon) -> bool:
    """Whether a clipped piece is worth annotating: at least 1 px^2 and not a sliver thinner than ~0.4 px."""
    area = _area(polygon)
    perimeter = sum(math.dist(p, q) for p, q in zip(polygon, polygon[1:] + polygon[:1]))
    return area >= 1.0 and 2 * area >= 0.4 * perimeter


def _annotation(instance: _Instance) -> dict:
    if instance.occluded:
        instance.visible = [p for p in instance.visible if _is_visible_piece(p)]
    polygons = [instance.outline] if not instance.occluded else instance.visible
    xs = [x for polygon in polygons for x, _ in polygon]
    ys = [y for polygon in polygons for _, y in polygon]
    x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
    return {
        "category_id": instance.category,
        "segmentation": [[round(v, 2) for point in polygon for v in point] for polygon in polygons],
        "area": round(sum(_area(p) for p in instance.visible), 2),
        "bbox": [round(x0, 2), round(y0, 2), round(max(xs) - x0, 2), round(max(ys) - y0, 2)],
        "iscrowd": 0,
    }


def draw_image(
    rng: np.random.Generator, categories: Sequence[int], width: int, height: int, style: dict
) -> tuple[Image.Image, list[dict]]:
    """Draw an image with one instance of each of `categories` (json ids, in drawing order) where they fit.

    Args:
        rng: the image's generator; the image is a function of its state, the arguments and `style`.
        categories: category json ids, in drawing order.
        width: image width in pixels.
        height: image height in pixels.
        style: ``textured_background``, ``clutter``, ``occlusion``, ``color_jitter``, ``max_rotation`` (see
            `generate_synthetic_lt`).

    Returns:
        The RGB image and the instances' annotations (``category_id``, ``segmentation``, ``area``, ``bbox``,
        ``iscrowd``), without ids.
    """
    image = _background(rng, width, height, style)
    draw = ImageDraw.Draw(image)
    instances = _place_instances(rng, categories, width, height, style)
    jitter = style["color_jitter"]
    for instance in instances:
        color = np.clip(
            np.array(COLORS[list(COLORS)[(instance.category - 1) % len(COLORS)]])
            + rng.integers(-jitter, jitter + 1, 3),
            0,
            255,
        )
        edge = tuple(int(v) for v in color * 0.7)
        draw.polygon(instance.outline, fill=tuple(int(v) for v in color), outline=edge)
    noise = rng.standard_normal(size=(height, width, 3), dtype=np.float32) * 6
    pixels = np.asarray(image, dtype=np.float32) + noise
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return image, [_annotation(instance) for instance in instances]
