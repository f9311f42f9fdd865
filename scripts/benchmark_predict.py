"""Prediction throughput of a trained run: images/s through `Predictor` (files in, detections out), and the
same model exported to each target (`lazytrain.modeling.export`): the time to export, and the latency.

    python scripts/benchmark_predict.py RUN_DIR IMAGE_DIR --images 100 --batch-sizes 1,4 --threads 2
    python scripts/benchmark_predict.py outputs/demo datasets/synthetic_lt/val --exports   # + every target

Each row predicts the first ``--images`` images of IMAGE_DIR once after one warm-up batch: read the file,
the test-time resize, the forward pass, masks pasted at the original size (what ``python -m lazytrain predict``
does, minus writing json). Score thresholds: 0.5 is the predict command's default, 0.001 the demo's evaluation
setting (more detections, more masks to paste). Export rows run one image per call (the exports take one
image) at the run's own score threshold, with masks pasted at the original size (TorchScript, legacy, at the
input size); ``--exports`` adds the ExportedProgram, ONNX Runtime and TorchScript, ``--aoti`` an AOTInductor
package (a minute or more to compile). Prints markdown tables and the machine's load.
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
    parser.add_argument("--exports", action="store_true", help="also export to each target and time it")
    parser.add_argument("--aoti", action="store_true", help="with --exports: also an AOTInductor package")
    return parser.parse_args(argv)


def time_predictor(predictor: Predictor, files: list[str]) -> tuple[float, float]:
    """(images/s, detections per image) of predicting `files` once, after a warm-up batch."""
    list(predictor.predict(files[: predictor.batch_size]))
    start = time.perf_counter()
    detections = sum(len(p) for p in predictor.predict(files))
    seconds = time.perf_counter() - start
    return len(files) / seconds, detections / len(files)


def time_exported(run: object, predictor: Predictor, files: list[str], *, in_input_size: bool = False):
    """(images/s, detections per image) of an export's `run(image, original_size)` on `files`, one image per
    call; `in_input_size`: detections in the resized image's pixels (TorchScript, legacy)."""

    def predict(file: str) -> int:
        original = to_image_tensor(file)
        image = predictor.mapper.map_image(original)
        size = image.shape[1:] if in_input_size else original.shape[1:]
        return len(run(image, torch.tensor(list(size)))[1])

    predict(files[0])
    start = time.perf_counter()
    detections = sum(predict(file) for file in files)
    seconds = time.perf_counter() - start
    return len(files) / seconds, detections / len(files)


def export_rows(args: argparse.Namespace, files: list[str]) -> list[tuple]:
    """One row per target: (name, 1, score threshold, images/s, detections per image, export seconds)."""
    from lazytrain.modeling import export, exported

    predictor = Predictor.from_run(args.run_dir, device="cpu", batch_size=1)
    example = predictor.mapper.map_image(to_image_tensor(files[0]))
    threshold = predictor.model.roi_heads.score_thresh
    rows = [("eager, one image per call", 1, threshold,
             *time_exported(export.ExportableRCNN(predictor.model), predictor, files), 0.0)]  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        program = export.export_program(predictor.model, example)
        loaded = exported.load_program(export.save_program(program, os.path.join(directory, "model.pt2")))
        seconds = time.perf_counter() - start
        rows.append(("ExportedProgram", 1, threshold, *time_exported(loaded, predictor, files), seconds))
        targets = [("ONNX Runtime (CPU)", export.export_onnx, exported.load_onnx, "model.onnx")]
        if args.aoti:  # before ONNX: `export_aoti` says why
            targets.insert(0, ("AOTInductor (CPU)", export.export_aoti, exported.load_aoti, "model_aoti.pt2"))
        for name, write, load, file in targets:
            start = time.perf_counter()
            path = write(program, os.path.join(directory, file))
            seconds = time.perf_counter() - start
            rows.append((name, 1, threshold, *time_exported(load(path), predictor, files), seconds))
        with warnings.catch_warnings():
            # torch's deprecation notices for TorchScript, the legacy target
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            start = time.perf_counter()
            script = export.export_torchscript(predictor.model, example, os.path.join(directory, "model.ts"))
            seconds = time.perf_counter() - start
            speed = time_exported(exported.load_torchscript(script), predictor, files, in_input_size=True)
        rows.append(("TorchScript (legacy)", 1, threshold, *speed, seconds))
    return rows


def main(argv: list[str] | None = None) -> list[tuple]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    files = find_images([args.image_dir])[: args.images]
    rows: list[tuple] = []
    for threshold in (float(v) for v in args.score_thresholds.split(",")):
        for batch_size in (int(v) for v in args.batch_sizes.split(",")):
            overrides = [f"model.roi_heads.score_thresh={threshold}"]
            predictor = Predictor.from_run(
                args.run_dir, device=args.device, overrides=overrides, batch_size=batch_size
            )
            rows.append(("Predictor", batch_size, threshold, *time_predictor(predictor, files), None))
    if args.exports:
        rows.extend(export_rows(args, files))
    print(
        f"{len(files)} images from {args.image_dir}; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        "| path | batch | score thresh | images/s | ms/image | detections/image | export s |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name, batch_size, threshold, speed, detections, export_seconds in rows:
        exported = "" if export_seconds is None else f"{export_seconds:.1f}"
        print(
            f"| {name} | {batch_size} | {threshold} | {speed:.1f} | {1000 / speed:.1f} | {detections:.1f} | "
            f"{exported} |"
        )
    print(f"machine load {os.getloadavg()[0]:.2f} (1 min) at the end")
    return rows


if __name__ == "__main__":
    main()
