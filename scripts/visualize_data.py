"""Look at the data a config feeds the model, before a long run.

    python scripts/visualize_data.py conf/rfs_maskrcnn_demo.py --split train --num 16 --out vis/data
    python scripts/visualize_data.py conf/rfs_maskrcnn_demo.py --source annotations --out vis/raw

``--source mapped`` (default) draws the mapper's output: images after augmentation with their boxes, masks
and class names, in the order the train loader (sampler included) yields them; for ``--split test`` the test
mapper is run with annotations kept. ``--source annotations`` draws the raw records as read from disk.
Writes one PNG per image and ``grid.png`` into ``--out``. Overrides are ``a.b=value`` config edits.
"""

from __future__ import annotations

import argparse
import itertools

from lazytrain.config import LazyConfig, instantiate
from lazytrain.data.catalog import MetadataCatalog
from lazytrain.data.mappers import read_image
from lazytrain.utils.visualizer import draw_mapped_sample, draw_record, save_gallery


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", help="a LazyConfig file, e.g. conf/rfs_maskrcnn_demo.py")
    parser.add_argument("overrides", nargs="*", help="config overrides a.b=value")
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--source", choices=["mapped", "annotations"], default="mapped")
    parser.add_argument("--num", type=int, default=16, help="number of images")
    parser.add_argument("--out", required=True, help="output directory")
    return parser.parse_args(argv)


def get_mapped_samples(loader_cfg, split: str, num: int) -> list[dict]:
    if split == "train":
        loader_cfg.num_workers = 0  # same samples (seeded per position), no worker processes to start
        batches = instantiate(loader_cfg)
        return list(itertools.islice(itertools.chain.from_iterable(batches), num))
    loader_cfg.mapper.is_train = True  # keep the annotations so they can be drawn
    records, mapper = instantiate(loader_cfg.dataset), instantiate(loader_cfg.mapper)
    return [mapper(record) for record in records[:num]]


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    cfg = LazyConfig.load(args.config)
    LazyConfig.apply_overrides(cfg, args.overrides)
    loader_cfg = cfg.dataloader[args.split]
    if args.source == "mapped":
        samples = get_mapped_samples(loader_cfg, args.split, args.num)
    else:
        samples = instantiate(loader_cfg.dataset)[: args.num]
    names = loader_cfg.dataset.names
    class_names = MetadataCatalog.get(names if isinstance(names, str) else names[0]).get("thing_classes")
    bgr = args.source == "mapped" and loader_cfg.mapper.get("image_format", "RGB") == "BGR"
    pictures, names = [], []
    for index, sample in enumerate(samples):
        if args.source == "mapped":
            pictures.append(draw_mapped_sample(sample, class_names, bgr=bgr))
        else:
            pictures.append(draw_record(read_image(sample["file_name"]), sample, class_names))
        names.append(f"{index:03d}_{sample['image_id']}")
    paths = save_gallery(pictures, names, args.out)
    print(f"Wrote {len(pictures)} images and grid.png to {args.out}")
    return paths


if __name__ == "__main__":
    main()
