"""scripts/benchmark_gpu_step.py, smoke-run on the CPU with the smallest settings (the GPU columns say n/a).
lazytrain's rows build the CPU recipe's R18-FPN (``--recipe``): the same code paths as the default R50-FPN
at a fraction of the cost; torchvision's model is always R50-FPN."""

import pytest
import torch

from lazytrain.data.datasets.synthetic import generate_synthetic_lt
from tests.modeling.helpers import CPU_RECIPE
from tests.scripts.loading import load_script

SMALLEST = ["--device", "cpu", "--iters", "1", "--warmup", "1", "--batch-sizes", "1", "--precisions", "fp32"]
SMALLEST += ["--size", "64", "--max-size", "64", "--num-classes", "30", "--num-images", "1", "--threads", "1"]
SMALLEST += ["--recipe", CPU_RECIPE]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> str:
    return generate_synthetic_lt(str(tmp_path_factory.mktemp("benchmark") / "synthetic_lt"), 2, 1)


@pytest.fixture(autouse=True)
def _keep_threads():
    threads = torch.get_num_threads()  # the script sets its --threads
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def script():
    return load_script("benchmark_gpu_step")


def test_cpu_run_prints_one_row_per_model(script, data_root, capsys):
    rows = script.main([*SMALLEST, "--data-root", data_root])
    out = capsys.readouterr().out
    assert [row["model"] for row in rows] == ["lazytrain", "torchvision"]
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| model | batch | precision | options | s/it | images/s | GPU busy |")
    for line, row in zip(table[1:], rows):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[:4] == [row["model"], "1", "fp32", "-"]
        # s/it and images/s: positive however slow the step (3 significant digits, not rounded to 0.0)
        assert float(cells[4]) == pytest.approx(row["s/it"], abs=1e-4) and float(cells[4]) > 0
        assert float(cells[5]) == pytest.approx(row["images/s"], rel=1e-2) and float(cells[5]) > 0
        assert cells[6:8] == ["n/a", "n/a"]  # GPU busy and peak memory: no GPU
        assert int(cells[8]) > 0 and cells[9] == "n/a" and int(cells[10]) > 0  # host syncs
        assert int(cells[11]) > 0 and float(cells[12]) > 0  # device ops, GB moved per step
    assert "CPU (1 threads), torch" in out and "images 64 x 64" in out


def test_variants_run_in_one_process_and_name_their_options(script, data_root, capsys):
    variants = "base;tf32;compile=default model.roi_heads.batch_size_per_image=64"
    argv = [*SMALLEST, "--data-root", data_root, "--models", "lazytrain", "--compile-backend", "aot_eager"]
    rows = script.main([*argv, "--variants", variants])
    assert [row["options"] for row in rows] == [
        "-",
        "tf32",
        "compile default (aot_eager), model.roi_heads.batch_size_per_image=64",
    ]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| lazytrain")]
    assert [line.split("|")[4].strip() for line in table] == [row["options"] for row in rows]
    # Compiled code runs eagerly under the counter: its counts are the eager form's, and say so.
    assert [line.split("|")[12].strip().startswith("eager ") for line in table] == [False, False, True]
    assert torch.get_float32_matmul_precision() == "highest"  # the last variant has tf32 off again
    with pytest.raises(ValueError, match="--variants takes channels-last, tf32, .* got 'fast'"):
        script.main([*argv, "--variants", "base;fast"])


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--num-classes", "1"], "--num-classes 1 is too few", id="too few classes"),
        pytest.param(["--models", "d2"], "--models takes lazytrain,torchvision", id="unknown model"),
        pytest.param(["--warmup", "0"], "--warmup must be >= 1", id="no warm-up"),
    ],
)
def test_bad_options_are_named(script, data_root, argv, message):
    with pytest.raises(ValueError, match=message):
        script.main([*SMALLEST, "--data-root", data_root, *argv])


def test_images_per_second_keep_three_significant_digits(script):
    assert [script.significant(value) for value in (0.043478, 5.2731, 123.46, 4567.8)] == [
        "0.0435",
        "5.27",
        "123",
        "4568",
    ]
    assert script.significant(0.0) == "0.0"


def test_gpu_busy_time_counts_overlapping_intervals_once(script):
    assert script.union_length([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 4.0
    assert script.union_length([]) == 0.0
