r"""Draw a run's detections (``*_instances_results.json``) over the evaluation images.

    python scripts/visualize_predictions.py outputs/demo --json-file datasets/synthetic_lt/lvis_v1_val.json \
        --image-root datasets/synthetic_lt --score-thresh 0.5 --num 8 --out vis/predictions

Writes one PNG per image (boxes, masks, "class score" labels) and ``grid.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from collections import defaultdict

from lazytrain.data.mappers import read_image
from lazytrain.utils.visualizer import draw_coco_results, save_gallery


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", help="run directory holding lvis_/coco_instances_results.json")
    parser.add_argument("--json-file", required=True, help="ground-truth COCO/LVIS json (images, categories)")
    parser.add_argument("--image-root", required=True, help="directory the json's file names are relative to")
    parser.add_argument("--score-thresh", type=float, default=0.5)
    parser.add_argument("--num", type=int, default=8, help="number of images (in the json's order)")
    parser.add_argument("--out", required=True, help="output directory")
    return parser.parse_args(argv)


def get_results_file(run_dir: str) -> str:
    files = sorted(glob.glob(os.path.join(run_dir, "*_instances_results.json")))
    if not files:
        raise FileNotFoundError(f"no *_instances_results.json in {run_dir}; run evaluation first.")
    return files[0]


def get_image_file(image: dict, image_root: str) -> str:
    # LVIS images carry only coco_url; their file is the url's base name under image_root.
    relative = image.get("file_name") or os.path.basename(image["coco_url"])
    return os.path.join(image_root, relative)


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    with open(args.json_file) as f:
        ground_truth = json.load(f)
    with open(get_results_file(args.run_dir)) as f:
        results = json.load(f)
    by_image = defaultdict(list)
    for result in results:
        by_image[result["image_id"]].append(result)
    class_names = {c["id"]: c["name"] for c in ground_truth["categories"]}
    images = ground_truth["images"][: args.num]
    pictures = [
        draw_coco_results(
            read_image(get_image_file(image, args.image_root)),
            by_image[image["id"]],
            class_names,
            args.score_thresh,
        )
        for image in images
    ]
    paths = save_gallery(pictures, [str(image["id"]) for image in images], args.out)
    print(f"Wrote {len(pictures)} images and grid.png to {args.out}")
    return paths


if __name__ == "__main__":
    main()
