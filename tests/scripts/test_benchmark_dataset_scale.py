"""scripts/benchmark_dataset_scale.py: its LVIS-shaped data set (tiny scale) and its memory readings."""

import json
import os

from lazytrain.data.datasets.cached_records import load_cached_json
from lazytrain.data.datasets.lvis import load_lvis_json
from tests.scripts.loading import load_script


def test_generated_set_is_lvis_shaped_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRAIN_CACHE", str(tmp_path / "cache"))
    script = load_script("benchmark_dataset_scale")
    json_file = script.generate(str(tmp_path / "set"), 0.002, script.DEFAULT_COUNTS)
    assert script.generate(str(tmp_path / "set"), 0.002, script.DEFAULT_COUNTS) == json_file  # kept
    with open(json_file) as f:
        data = json.load(f)
    assert len(data["images"]) == 200 and len(data["categories"]) == 1203
    points = {len(a["segmentation"][0]) // 2 for a in data["annotations"]}
    assert min(points) >= 16 and max(points) <= 80 and len(points) > 30
    for annotation in data["annotations"][:50]:
        x, y, w, h = annotation["bbox"]
        polygon = annotation["segmentation"][0]
        assert x - 0.01 <= min(polygon[0::2]) and max(polygon[0::2]) <= x + w + 0.01
        assert y - 0.01 <= min(polygon[1::2]) and max(polygon[1::2]) <= y + h + 0.01
    image_root = str(tmp_path / "set" / "coco")
    first = data["images"][0]
    assert os.path.realpath(os.path.join(image_root, first["file_name"])).endswith(
        "landscape.jpg" if first["width"] > first["height"] else "portrait.jpg"
    )
    assert list(load_cached_json(json_file, image_root, lvis=True)) == load_lvis_json(json_file, image_root)
    key = script.measure_content_key(json_file)
    assert set(key) == {"sha256", "blake2b"} and all(0 < seconds < 10 for seconds in key.values())
    assert script._private_bytes() > 0 and script._sample_pss([os.getpid()]) > script._private_bytes() // 2
