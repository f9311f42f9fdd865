#!/usr/bin/env bash
# Round 3 of the GPU step (docs/benchmarks.md, "Round 3"): the step with fixed shapes against today's dynamic
# step, on one lent GPU, in the order of what matters most. Run from the project root on the GPU machine:
#
#   bash scripts/gpu_round3.sh WHEEL_DIR LOG_DIR 1   # ~6-7 min: eager dynamic vs fixed, one CUDA graph, syncs left
#   bash scripts/gpu_round3.sh WHEEL_DIR LOG_DIR 2   # ~8 min: the whole fixed step compiled by inductor, the CUDA graph in fp32
#
# WHEEL_DIR holds the wheels the GPU machine lacks (../shared/gpu/wheels, carried in the checkout); each line
# writes LOG_DIR/<name>.log and prints its tables. A session's device time (15 min, the start included) fits
# part 1 with a margin; part 2 needs a second session or what is left. Arguments after PART go to every
# benchmark line (a CPU smoke run of the plumbing: `--device cpu --recipe recipes/models/mask_rcnn_r18_fpn_cpu.py
# --num-classes 30 --size 64 --max-size 64 --batch-sizes 2 --iters 1 --warmup 1 --num-images 2`).
set -o pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash scripts/gpu_round3.sh WHEEL_DIR LOG_DIR 1|2 [benchmark arguments]" >&2
    exit 2
fi
wheels=$1 logs=$2 part=$3
shift 3
if [ "$part" != 1 ] && [ "$part" != 2 ]; then # before the set-up spends device time
    echo "gpu_round3.sh: PART is 1 or 2, got '$part'" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1 LAZYTRAIN_DATASETS=${LAZYTRAIN_DATASETS:-/tmp/lazytrain_datasets}
mkdir -p "$logs"
data=$LAZYTRAIN_DATASETS/synthetic_lt
started=$SECONDS

uptime
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
if ! python3 -c "import hydra, msgspec, pycocotools, iopath, faster_coco_eval" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps "$wheels"/*.whl 2>&1 | grep -v WARN | tail -2
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # when the editable install needs a newer setuptools
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
python3 -c "from lazytrain.data.datasets.synthetic import generate_synthetic_lt; generate_synthetic_lt('$data')" \
    >"$logs/data.log" 2>&1 || {
    tail -5 "$logs/data.log"
    exit 1
}

# measure NAME SECONDS BENCHMARK-ARGUMENTS...: one benchmark line, its own log and time limit.
measure() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (t=$((SECONDS - started)) s, limit $limit s)"
    timeout "$limit" python3 scripts/benchmark_gpu_step.py --data-root "$data" --models lazytrain \
        --batch-sizes 8 "$@" >"$logs/$name.log" 2>&1
    echo "rc=$?"
    grep -E "^\||Error|error:" "$logs/$name.log" | cut -c1-300
}

case $part in
1)
    measure eager_dynamic_vs_fixed 150 --precisions fp32,bf16 --variants "base;fixed-shapes" "$@"
    measure cuda_graph_bf16 150 --precisions bf16 --variants "fixed-shapes cuda-graph" "$@"
    measure syncs_left 60 --precisions bf16 --iters 3 --variants fixed-shapes --sync-table "$@"
    ;;
2)
    measure compiled_default_bf16 200 --precisions bf16 --variants "fixed-shapes fixed-compile=default" "$@"
    measure cuda_graph_fp32 120 --precisions fp32 --variants "fixed-shapes cuda-graph" "$@"
    measure compiled_reduce_overhead_bf16 150 --precisions bf16 \
        --variants "fixed-shapes fixed-compile=reduce-overhead" "$@"
    ;;
esac
echo "== end (t=$((SECONDS - started)) s)"
