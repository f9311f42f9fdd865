"""``python -m lazytrain convert-detectron2 FILE OUT.pth [--force]``: a detectron2 checkpoint as a lazytrain one.

    python -m lazytrain convert-detectron2 model_final_f10217.pkl d2_mask_rcnn_r50.pth

Reads a detectron2 Mask/Faster R-CNN R-FPN checkpoint (a model zoo ``.pkl``, read by an unpickler that builds
numpy arrays only, or a ``.pth`` its training wrote), converts it (`lazytrain.modeling.detectron2_weights`:
names, conv1 to RGB, background class first) and writes ``{"model": state_dict}``, which
``train.init_checkpoint=OUT.pth`` loads as it is. ``train.init_checkpoint`` also takes the detectron2 file
directly; this command is for those who prefer to convert once. OUT is written atomically and never replaced
unless ``--force`` is given. The model that gives detectron2's detections with these weights is
recipes/models/mask_rcnn_fpn_detectron2.py's.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

from lazytrain.errors import LazytrainError
from lazytrain.modeling.detectron2_weights import convert_detectron2_state_dict, is_detectron2_state_dict
from lazytrain.modeling.weights import read_state_dict
from lazytrain.utils.file_io import atomic_write

__all__ = ["main"]


def _fail(message: str) -> None:
    print(f"lazytrain convert-detectron2: {message}", file=sys.stderr)
    raise SystemExit(1)


def main(argv: list[str]) -> None:
    """Convert FILE into OUT (see the module docstring); errors are one line and exit status 1."""
    parser = argparse.ArgumentParser(
        prog="python -m lazytrain convert-detectron2",
        description="Convert a detectron2 Mask/Faster R-CNN R-FPN checkpoint (.pkl or .pth) to a lazytrain .pth.",
    )
    parser.add_argument("file", help="detectron2 checkpoint: a model zoo model_final_*.pkl or a .pth")
    parser.add_argument("out", help="the lazytrain checkpoint to write (.pth)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not args.force:
        _fail(f"{args.out} exists; give another name or --force to replace it.")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        _fail(f"the folder of {args.out} does not exist.")
    try:
        state, _ = read_state_dict(args.file)
        if not is_detectron2_state_dict(state):
            _fail(
                f"{args.file} is not a detectron2 checkpoint (no backbone.bottom_up.* or proposal_generator.* keys)."
            )
        converted, notes = convert_detectron2_state_dict(state, path=args.file)
    except (LazytrainError, ValueError, FileNotFoundError) as error:
        _fail(str(error).splitlines()[0])
    try:
        atomic_write(args.out, functools.partial(torch.save, {"model": converted}), replace=args.force)
    except FileExistsError:
        _fail(f"{args.out} exists; give another name or --force to replace it.")
    print(f"wrote {args.out}: {len(converted)} tensors")
    for note in notes:
        print(f"  {note}")
    print(
        "Load it with train.init_checkpoint="
        + args.out
        + " into recipes/models/mask_rcnn_fpn_detectron2.py's model."
    )
