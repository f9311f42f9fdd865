"""`setup_logger` (console on rank 0, per-rank files, idempotent) and the rate-limited logging helpers."""

import logging

import pytest

from lazytrain.utils import logger as logger_module
from lazytrain.utils.logger import (
    create_small_table,
    log_every_n,
    log_every_n_seconds,
    log_first_n,
    setup_logger,
)


@pytest.fixture
def fresh_logger(request):
    name = f"lazytrain_test_{request.node.name}"
    yield name
    log = logging.getLogger(name)
    for handler in list(log.handlers):
        handler.close()
        log.removeHandler(handler)


def test_rank_zero_console_and_log_txt(tmp_path, capsys, fresh_logger):
    log = setup_logger(str(tmp_path), 0, fresh_logger)
    log.getChild("engine").info("hello")
    log.debug("only in the file")
    assert "hello" in capsys.readouterr().out
    text = (tmp_path / "log.txt").read_text()
    assert f"{fresh_logger}.engine INFO] hello" in text and "only in the file" in text


def test_other_ranks_write_their_own_file_and_no_console(tmp_path, capsys, fresh_logger):
    log = setup_logger(str(tmp_path), distributed_rank=3, name=fresh_logger)
    log.warning("from rank 3")
    assert capsys.readouterr().out == ""
    assert "from rank 3" in (tmp_path / "log.txt.rank3").read_text()
    assert not (tmp_path / "log.txt").exists()


def test_setup_is_idempotent(tmp_path, capsys, fresh_logger):
    for _ in range(3):
        log = setup_logger(str(tmp_path), name=fresh_logger)
    log.info("once")
    assert capsys.readouterr().out.count("once") == 1
    assert (tmp_path / "log.txt").read_text().count("once") == 1
    setup_logger(str(tmp_path / "job2"), name=fresh_logger).info("second job")
    assert "second job" in (tmp_path / "job2" / "log.txt").read_text()
    assert "second job" not in (tmp_path / "log.txt").read_text()


def test_abbreviated_name_and_colors(tmp_path, monkeypatch, fresh_logger):
    lines = []
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    log = setup_logger(str(tmp_path), name=fresh_logger, abbrev_name="lt")
    console = next(h for h in log.handlers if not isinstance(h, logging.FileHandler))
    record = logging.LogRecord(f"{fresh_logger}.hooks", logging.WARNING, __file__, 1, "careful", None, None)
    lines.append(console.format(record))
    record = logging.LogRecord(f"{fresh_logger}.hooks", logging.INFO, __file__, 1, "fine", None, None)
    lines.append(console.format(record))
    assert "lt.hooks WARNING] careful" in lines[0] and lines[0].startswith("\033[33m")
    assert "lt.hooks INFO] fine" in lines[1] and "\033[" not in lines[1]
    assert record.name == f"{fresh_logger}.hooks"  # the file handler still sees the full name


def test_log_first_n_and_every_n(caplog):
    caplog.set_level(logging.INFO)
    for i in range(5):
        log_first_n(logging.INFO, f"first {i}", n=2, key="caller")
        log_every_n(logging.INFO, f"every {i}", n=2)
    for _ in range(3):
        log_first_n(logging.INFO, "same message", key="message")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["first 0", "every 0", "first 1", "every 2", "every 4", "same message"]
    assert caplog.records[0].name == __name__
    with pytest.raises(ValueError, match="must combine 'caller' and 'message'"):
        log_first_n(logging.INFO, "x", key="line")


def test_log_every_n_seconds(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    clock = iter([0.0, 0.5, 1.5, 1.6])
    monkeypatch.setattr(logger_module.time, "perf_counter", lambda: next(clock))
    for i in range(4):
        log_every_n_seconds(logging.INFO, f"tick {i}", n=1.0)
    assert [r.getMessage() for r in caplog.records] == ["tick 0", "tick 2"]


def test_create_small_table():
    table = create_small_table({"AP": 40.12345, "APr": 3.5, "iteration": 10})
    assert table.splitlines() == [
        "| AP     | APr   | iteration |",
        "|:-------|:------|:----------|",
        "| 40.123 | 3.500 | 10        |",
    ]
