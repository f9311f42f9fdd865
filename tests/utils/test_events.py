import json
import logging
import math
import os

import pytest
import torch

from lazytrain.engine.hooks import (
    IterationTimer,
    LRScheduler,
    PeriodicWriter,
    TorchMemoryStats,
    TorchProfiler,
)
from lazytrain.engine.train_loop import SimpleTrainer
from lazytrain.utils.events import (
    EventStorage,
    JSONWriter,
    TensorboardWriter,
    format_metrics_line,
    get_event_storage,
    get_scalars_by_iteration,
    parse_metrics_line,
)
from tests.engine import toy


def test_storage_history_smoothing_and_name_scope():
    with EventStorage(start_iter=5) as storage:
        assert get_event_storage() is storage
        for i, value in enumerate([1.0, 9.0, 2.0, 3.0]):
            storage.iter = 5 + i
            storage.put_scalar("loss", value)
            storage.put_scalar("lr", value, smoothing_hint=False)
        with storage.name_scope("val"):
            storage.put_scalar("AP", 0.5)
        assert storage.history("loss").median(3) == 3.0
        assert storage.history("loss").avg(4) == pytest.approx(3.75)
        assert storage.history("loss").global_avg() == pytest.approx(3.75)
        assert storage.latest_with_smoothing_hint(3)["loss"] == (3.0, 8)
        assert storage.latest_with_smoothing_hint(3)["lr"] == (3.0, 8)
        assert storage.latest()["val/AP"] == (0.5, 8)
    with pytest.raises(RuntimeError, match="inside a `with EventStorage"):
        get_event_storage()


def test_json_writer_writes_each_iteration_once(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage() as storage:
        storage.put_scalar("loss", 1.0)
        writer.write()
        writer.write()
        storage.iter = 1
        storage.put_scalars(loss=2.0, smoothing_hint=False)
        writer.write()
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # "loss" was first put with smoothing, so the writer reports the windowed median (1 + 2) / 2
    assert lines == [{"iteration": 0, "loss": 1.0}, {"iteration": 1, "loss": 1.5}]


def test_json_writer_of_a_training_run_drops_the_lines_it_redoes_and_an_evaluation_appends(tmp_path):
    """A run resumed from iteration 2 keeps lines 0-1; a run resumed from no checkpoint (its first attempt
    failed before one, so it starts at 0) starts the file afresh, the earlier lines kept beside it (failed
    before: iterations 1, 2, 1, 2 in one file); an evaluation (no start_iter) appends."""
    path = tmp_path / "metrics.json"
    first_attempt = "".join(format_metrics_line(i, {"loss": 9.0}) for i in range(4))

    def lines_after(start_iter, **kwargs):
        path.write_text(first_attempt)
        writer = JSONWriter(str(path), start_iter=start_iter, **kwargs)
        with EventStorage(start_iter or 0) as storage:
            storage.put_scalars(loss=1.0, smoothing_hint=False)
            writer.write()
        writer.close()
        return [(r["iteration"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]

    assert lines_after(2) == [(0, 9.0), (1, 9.0), (2, 1.0)]
    assert lines_after(0) == [(0, 1.0)]
    assert (tmp_path / "metrics.earlier-1.json").read_text() == first_attempt
    first_attempt = ""  # an attempt that failed before its first write: nothing to keep, no file added
    assert lines_after(0) == [(0, 1.0)] and not (tmp_path / "metrics.earlier-2.json").exists()
    first_attempt = "".join(format_metrics_line(i, {"loss": 9.0}) for i in range(4))
    assert lines_after(0) == [(0, 1.0)]  # a second time: the next free name, the first one untouched
    assert (tmp_path / "metrics.earlier-2.json").read_text() == first_attempt
    assert (tmp_path / "metrics.earlier-1.json").read_text() == first_attempt
    assert lines_after(None) == [(0, 9.0), (1, 9.0), (2, 9.0), (3, 9.0), (0, 1.0)]


def _strict_json(line):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def test_json_writer_writes_non_finite_values_as_null_and_readers_get_nan(tmp_path):
    """metrics.json is strict JSON (failed before: bare NaN, which JavaScript and jq reject); lazytrain's
    readers get NaN back, from new files and from older ones that hold NaN."""
    from lazytrain.program.sweep_summary import read_final_metrics
    from lazytrain.utils.run_dirs import read_metrics

    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage() as storage:
        storage.put_scalars(
            smoothing_hint=False, **{"segm/APr": math.nan, "bbox/APr": math.inf, "segm/AP": 31.5}
        )
        writer.write()
    writer.close()
    text = path.read_text()
    assert _strict_json(text) == {"bbox/APr": None, "iteration": 0, "segm/AP": 31.5, "segm/APr": None}
    (record,) = read_metrics(str(tmp_path))
    assert math.isnan(record["segm/APr"]) and math.isnan(record["bbox/APr"]) and record["segm/AP"] == 31.5
    final = read_final_metrics(str(tmp_path))
    assert math.isnan(final["segm/APr"]) and final["segm/AP"] == 31.5
    path.write_text('{"iteration": 0, "segm/APr": NaN}\n')  # written by an earlier lazytrain
    assert math.isnan(parse_metrics_line(path.read_text())["segm/APr"])
    assert format_metrics_line(3, {"loss": 0.5}) == '{"iteration": 3, "loss": 0.5}\n'


def test_tensorboard_writer_writes_event_file(tmp_path):
    writer = TensorboardWriter(str(tmp_path))
    with EventStorage() as storage:
        storage.put_scalar("loss", 1.0)
        storage.put_image("sample", torch.rand(3, 8, 8))
        storage.put_histogram("weights", torch.randn(100))
        writer.write()
    writer.close()
    files = [f for f in os.listdir(tmp_path) if f.startswith("events.out.tfevents")]
    assert files and os.path.getsize(tmp_path / files[0]) > 100


def test_profiler_hook_writes_a_chrome_trace_and_memory_stats_is_noop_on_cpu(tmp_path):
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.register_hooks(
        {
            "profiler": TorchProfiler(str(tmp_path), start_iter=1, end_iter=3),
            "memory": TorchMemoryStats(period=1),
            "writer": PeriodicWriter(str(tmp_path), period=2, tensorboard=False),
        }
    )
    trainer.train(0, 4)
    traces = [f for f in os.listdir(tmp_path) if f.startswith("profiler-trace")]
    assert traces == ["profiler-trace-rank0-iter2.json"]
    assert json.load(open(tmp_path / traces[0]))["traceEvents"]


def test_windowed_statistics_read_only_the_window_of_a_long_history():
    with EventStorage() as storage:
        for i in range(50000):
            storage.iter = i
            storage.put_scalar("loss", float(i))
        buffer = storage.history("loss")
        assert buffer.median(3) == 49998.0
        assert buffer.avg(4) == pytest.approx(49997.5)
        assert buffer.latest_iteration() == 49999
        assert buffer.global_avg() == pytest.approx(24999.5)
        assert storage.latest_with_smoothing_hint(5)["loss"] == (49997.0, 49999)


def test_metric_printer_logs_one_line_per_period_with_losses_times_and_lr(tmp_path, caplog):
    model = toy.ToyRegressor()
    trainer = SimpleTrainer(model, toy.ToyLoader(), torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.register_hooks(
        {
            "timer": IterationTimer(),
            "lr": LRScheduler(multiplier=lambda iteration: 0.5),
            "writer": PeriodicWriter(str(tmp_path), period=4, tensorboard=False),
        }
    )
    with caplog.at_level(logging.INFO, logger="lazytrain.engine"):
        trainer.train(0, 10)
    lines = [r.getMessage() for r in caplog.records if "iter: " in r.getMessage()]
    assert [int(line.split("iter: ")[1].split()[0]) for line in lines] == [3, 7, 9]
    assert all(
        key in lines[0]
        for key in ("eta: ", "loss_mse: ", "loss_zero: ", "time: ", "data_time: ", "lr: 0.005")
    )


def test_scalars_by_iteration_are_what_metrics_json_writes_next():
    with EventStorage(0) as storage:
        for iteration in range(3):
            storage.iter = iteration
            storage.put_scalar("loss", float(iteration))  # smoothed: the windowed median is written
            storage.put_scalar("lr", 0.1 * iteration, smoothing_hint=False)
        storage.put_scalars(**{"bbox/AP": 5.0}, smoothing_hint=False, cur_iter=3)
        assert get_scalars_by_iteration(storage, window=20) == {
            2: {"loss": 1.0, "lr": 0.2},
            3: {"bbox/AP": 5.0},
        }
        assert get_scalars_by_iteration(storage, window=20, after=2) == {3: {"bbox/AP": 5.0}}
