"""Prediction throughput of a trained run: images/s through `Predictor` (files in, detections out), and the
same model exported to TorchScript and ONNX Runtime.

    python scripts/benchmark_predict.py RUN_DIR IMAGE_DIR --images 100 --batch-sizes 1,4 --threads 2
    python scripts/benchmark_predict.py outputs/demo datasets/synthetic_lt/val --exports   # + TorchScript, ONNX

Each row predicts the first ``--images`` images of IMAGE_DIR once after one warm-up batch: read the file,
the test-time resize, the forward pass, masks pasted at the original size (what ``python -m lazytrain predict``
does, minus writing json). Score thresholds: 0.5 is the predict command's default, 0.001 the demo's evaluation
setting (more detections, more masks to paste). Export rows run one image per call (the exported graphs take
one image) at the run's own score threshold. Prints a markdown table and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

# As `python -m lazytrain` runs: idle OpenMP threads sleep instead of spinning (set before torch loads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from lazytrain.program.predictor import Predictor, to_image_tensor  # noqa: E402
from lazytrain.program.run_command import find_images  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", help="a training run's output directory")
    parser.add_argument("image_dir", help="folder of images to predict")
    parser.add_argument("--images", type=int, default=100, help="how many images of the folder")
    parser.add_argument("--batch-sizes", default="1,4", help="comma-separated Predictor batch sizes")
    parser.add_argument("--score-thresholds", default="0.5,0.001", help="comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--exports", action="store_true", help="also time TorchScript and ONNX Runtime")
    return parser.parse_args(argv)


def time_predictor(predictor: Predictor, files: list[str]) -> tuple[float, float]:
    """(images/s, detections per image) of predicting `files` once, after a warm-up batch."""
    list(predictor.predict(files[: predictor.batch_size]))
    start = time.perf_counter()
    detections = sum(len(p) for p in predictor.predict(files))
    seconds = time.perf_counter() - start
    return len(files) / seconds, detections / len(files)


def time_exported(run: object, predictor: Predictor, files: list[str]) -> tuple[float, float]:
    """(images/s, detections per image) of an exported graph `run(image)` on `files`, one image per call."""

    def predict(file: str) -> int:
        return len(run(predictor.mapper.map_image(to_image_tensor(file)))[1])

    predict(files[0])
    start = time.perf_counter()
    detections = sum(predict(file) for file in files)
    seconds = time.perf_counter() - start
    return len(files) / seconds, detections / len(files)


def export_rows(args: argparse.Namespace, files: list[str]) -> list[tuple]:
    from lazytrain.modeling import export

    # torch's deprecation notices for TorchScript and its ONNX exporter (python -m lazytrain export says why
    # they do not matter here)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    predictor = Predictor.from_run(args.run_dir, device="cpu", batch_size=1)
    example = predictor.mapper.map_image(to_image_tensor(files[0]))
    threshold = predictor.model.roi_heads.score_thresh
    eager = export.ExportableRCNN(predictor.model)
    rows = [("eager, one image per call", 1, threshold, *time_exported(eager, predictor, files))]
    with tempfile.TemporaryDirectory() as directory:
        script = export.export_torchscript(predictor.model, example, os.path.join(directory, "model.ts"))
        rows.append(
            ("TorchScript", 1, threshold, *time_exported(export.load_torchscript(script), predictor, files))
        )
        onnx_file = export.export_onnx(predictor.model, example, os.path.join(directory, "model.onnx"))
        rows.append(
            (
                "ONNX Runtime (CPU)",
                1,
                threshold,
                *time_exported(export.load_onnx(onnx_file), predictor, files),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> list[tuple]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    files = find_images([args.image_dir])[: args.images]
    rows = []
    for threshold in (float(v) for v in args.score_thresholds.split(",")):
        for batch_size in (int(v) for v in args.batch_sizes.split(",")):
            overrides = [f"model.roi_heads.score_thresh={threshold}"]
            predictor = Predictor.from_run(
                args.run_dir, device=args.device, overrides=overrides, batch_size=batch_size
            )
            rows.append(("Predictor", batch_size, threshold, *time_predictor(predictor, files)))
    if args.exports:
        rows.extend(export_rows(args, files))
    print(
        f"{len(files)} images from {args.image_dir}; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print("| path | batch | score thresh | images/s | detections/image |\n|---|---|---|---|---|")
    for name, batch_size, threshold, speed, detections in rows:
        print(f"| {name} | {batch_size} | {threshold} | {speed:.1f} | {detections:.1f} |")
    print(f"machine load {os.getloadavg()[0]:.2f} (1 min) at the end")
    return rows


if __name__ == "__main__":
    main()
