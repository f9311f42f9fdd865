"""Train-loader throughput on the embedded data set (synthetic_lt_train) vs decode-only reading of the same files.

    python scripts/benchmark_loader.py --images 800 --workers 2 --repeats 3

Paths timed (images/s, median of --repeats runs, worker start-up and the first batch excluded):

1. decode only, one process: `read_image` on each file in turn;
2. decode only, a plain torch DataLoader with --workers workers (the parallel ceiling of reading);
3. `build_detection_train_loader` with --workers workers and a decode-only mapper: what the loader itself adds
   (sampler, aspect grouping, per-sample seeding, batches);
4. `build_detection_train_loader` with the recipe's `DatasetMapper` (resize 160-192, flip, polygon masks).

Goal: path 4 >= 0.8 x path 1.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from lazytrain.data.build import build_detection_train_loader, trivial_batch_collator  # noqa: E402
from lazytrain.data.catalog import DatasetCatalog  # noqa: E402
from lazytrain.data.mappers import DatasetMapper, read_image  # noqa: E402
from lazytrain.data.transforms import RandomFlip, ResizeShortestEdge  # noqa: E402


class DecodeOnly:
    """Mapper that only reads and decodes the image (picklable for workers)."""

    def __call__(self, record: dict) -> dict:
        return {"image": torch.from_numpy(read_image(record["file_name"])), "image_id": record["image_id"]}


class Files(torch.utils.data.Dataset):
    def __init__(self, records: list[dict]) -> None:
        self.records = records
        self.decode = DecodeOnly()

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        return self.decode(self.records[index])


def images_per_second(batches, num_images: int, batch_size: int) -> float:
    """Rate over `num_images` images after the first batch (start-up is not throughput)."""
    stream = iter(batches)
    next(stream)
    start = time.perf_counter()
    for _ in range(num_images // batch_size):
        next(stream)
    return num_images // batch_size * batch_size / (time.perf_counter() - start)


def full_mapper() -> DatasetMapper:
    """The mapper of recipes/data/synthetic_lt.py."""
    return DatasetMapper(
        True, [ResizeShortestEdge([160, 176, 192], max_size=256), RandomFlip()], use_instance_mask=True
    )


def measure(records: list[dict], path: int, args: argparse.Namespace) -> float:
    if path == 1:
        cycle = itertools.cycle(records)
        one_by_one = ([DecodeOnly()(next(cycle))] for _ in itertools.count())
        return images_per_second(one_by_one, args.images, 1)
    if path == 2:
        loader = torch.utils.data.DataLoader(
            Files(records),
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.workers,
            collate_fn=trivial_batch_collator,
        )
        return images_per_second(
            itertools.chain.from_iterable(itertools.repeat(loader)), args.images, args.batch
        )
    mapper = DecodeOnly() if path == 3 else full_mapper()
    loader = build_detection_train_loader(
        records, mapper=mapper, total_batch_size=args.batch, num_workers=args.workers, seed=0
    )
    return images_per_second(loader, args.images, args.batch)


def cpu_ms_per_image(records: list[dict], mapper, num_images: int) -> float:
    """CPU time of `mapper` per image in this process (one torch thread, as in a worker)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cycle = itertools.cycle(records)
        start = time.process_time()
        for _ in range(num_images):
            mapper(next(cycle))
        return (time.process_time() - start) / num_images * 1000
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=800, help="images timed per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    records = DatasetCatalog.get("synthetic_lt_train")
    names = {
        1: "decode only, 1 process",
        2: f"decode only, torch DataLoader, {args.workers} workers",
        3: f"train loader, {args.workers} workers, decode-only mapper",
        4: f"train loader, {args.workers} workers, DatasetMapper (resize, flip, masks)",
    }
    rates: dict[int, list[float]] = {path: [] for path in names}
    for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit every path alike
        for path in names:
            rates[path].append(measure(records, path, args))
    median = {path: statistics.median(values) for path, values in rates.items()}
    print(
        f"\n{len(records)} train images, batch {args.batch}, {args.images} images per run, median of {args.repeats}\n"
    )
    print("| path | images/s | runs | x decode-only (1 process) |")
    print("|---|---|---|---|")
    for path, name in names.items():
        runs = ", ".join(f"{r:.0f}" for r in rates[path])
        print(f"| {name} | {median[path]:.0f} | {runs} | {median[path] / median[1]:.2f} |")
    decode = cpu_ms_per_image(records, DecodeOnly(), args.images)
    full = cpu_ms_per_image(records, full_mapper(), args.images)
    print("\nCPU per image in one process (one torch thread):\n")
    print("| work | ms / image |")
    print("|---|---|")
    print(f"| decode only | {decode:.2f} |")
    print(f"| DatasetMapper (decode, resize, flip, polygon masks) | {full:.2f} |")


if __name__ == "__main__":
    main()
