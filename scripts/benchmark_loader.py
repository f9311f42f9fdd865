"""Train-loader throughput on the embedded data set vs decode-only reading of the same files.

    python scripts/benchmark_loader.py --images 600 --workers 2

The loader (2 workers) reads, decodes, resizes, flips and rasterizes masks; decode-only just reads and
decodes each JPEG in one process. Goal: loader images/s >= 0.8 x decode-only images/s.
"""

from __future__ import annotations

import argparse
import itertools
import time

from lazytrain.data.build import build_detection_train_loader
from lazytrain.data.catalog import DatasetCatalog
from lazytrain.data.mappers import DatasetMapper, read_image
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    records = DatasetCatalog.get("synthetic_lt_train")
    start = time.perf_counter()
    for record in itertools.islice(itertools.cycle(records), args.images):
        read_image(record["file_name"])
    decode = args.images / (time.perf_counter() - start)

    mapper = DatasetMapper(True, [ResizeShortestEdge([160, 176, 192], max_size=256), RandomFlip()])
    loader = build_detection_train_loader(
        records, mapper=mapper, total_batch_size=args.batch, num_workers=args.workers, seed=0
    )
    stream = iter(loader)
    next(stream)  # worker start-up is not throughput
    start = time.perf_counter()
    batches = args.images // args.batch
    for _ in range(batches):
        next(stream)
    loaded = batches * args.batch / (time.perf_counter() - start)
    print("| path | images/s |")
    print("|---|---|")
    print(f"| decode only (1 process) | {decode:.0f} |")
    print(f"| train loader ({args.workers} workers, full mapper) | {loaded:.0f} |")
    print(f"| ratio | {loaded / decode:.2f} |")


if __name__ == "__main__":
    main()
