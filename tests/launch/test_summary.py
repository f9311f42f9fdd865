"""The sweep summary table: rows per job, only the overrides that vary, metrics in reading order."""

import csv
import json
import os

from PIL import Image

from lazytrain.program.sweep_summary import list_failures, write_summary, write_summary_plot


def make_job(sweep_dir, job, overrides, metrics, status="ok", seconds=12.5, reason=None):
    job_dir = sweep_dir / str(job)
    os.makedirs(job_dir / ".hydra")
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    record = {"status": status, "seconds": seconds, **({"reason": reason} if reason else {})}
    (job_dir / "lazytrain_job.json").write_text(json.dumps(record))
    lines = [{"iteration": 9, "total_loss": 1.0}, {"iteration": 10, **metrics}]
    (job_dir / "metrics.json").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_summary_orders_metrics_and_drops_shared_overrides(tmp_path):
    names = ["APl", "AP50", "APr", "AP", "APf", "APc"]
    make_job(tmp_path, 0, ["t=0", "seed=1"], {f"{task}/{n}": 1.0 for task in ("bbox", "segm") for n in names})
    disk_full = "OSError: [Errno 28] No space left on device:\n  '/tmp/run/model_final.pth'"
    make_job(tmp_path, 1, ["t=0.1", "seed=1"], {"segm/AP": 2.0, "bbox/AP": 3.0}, "failed", reason=disk_full)
    table, rows = write_summary(str(tmp_path))

    with open(tmp_path / "summary.csv") as f:
        header, *lines = list(csv.reader(f))
    expected = ["AP", "APr", "APc", "APf", "AP50", "APl"]
    metrics = [f"{t}/{n}" for t in ("segm", "bbox") for n in expected]
    assert header == ["job", "overrides", "status", "seconds", *metrics, "reason"]
    assert [line[-1] for line in lines] == ["", disk_full]
    assert [row["overrides"] for row in rows] == ["t=0", "t=0.1"]
    assert "| 1 | t=0.1 | failed | 12.50 | 2.00 |" in table
    # Under the table, each failed job on one line with its reason.
    failed = "Failed jobs:\n- job 1 (t=0.1): OSError: [Errno 28] No space left on device: '/tmp/run/model_final.pth'\n"
    assert table.endswith(failed)
    assert (tmp_path / "summary.md").read_text() == table


def test_a_job_that_left_no_record_is_failed_and_says_so(tmp_path):
    make_job(tmp_path, 0, ["t=0"], {"segm/AP": 1.0})
    make_job(tmp_path, 1, ["t=0.1"], {})
    os.remove(tmp_path / "1" / "lazytrain_job.json")  # killed before Hydra's end-of-job callback
    make_job(tmp_path, 2, ["t=0.2"], {}, "failed", reason="x" * 400)
    _, rows = write_summary(str(tmp_path))

    assert [row["status"] for row in rows] == ["ok", "failed", "failed"]
    assert list_failures(rows) == [
        "job 1 (t=0.1): no record of the job's end (the process was killed, or the job is still running)",
        "job 2 (t=0.2): " + "x" * 297 + "...",
    ]


def test_seeds_are_aggregated_per_setting_of_the_other_overrides(tmp_path):
    # 2 settings x 3 seeds; seed 2 of t=0.1 failed and must not count.
    values = {("0", 0): (10.0, 1.0), ("0", 1): (12.0, 2.0), ("0", 2): (14.0, 6.0), ("0.1", 0): (20.0, 3.0)}
    values[("0.1", 1)] = (16.0, 5.0)
    for job, (t, seed) in enumerate((t, s) for t in ("0", "0.1") for s in range(3)):
        ap, apr = values.get((t, seed), (99.0, 99.0))
        status = "failed" if (t, seed) == ("0.1", 2) else "ok"
        metrics = {"segm/AP": ap, "segm/APr": apr} if status == "ok" else {}
        make_job(tmp_path, job, [f"t={t}", f"train.seed={seed}", "n=1"], metrics, status=status)
    table, _ = write_summary(str(tmp_path))

    with open(tmp_path / "summary_seeds.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["overrides"], r["seeds"], r["failed"]) for r in rows] == [
        ("t=0", "3", "0"),
        ("t=0.1", "2", "1"),
    ]
    assert float(rows[0]["segm/AP"]) == 12.0 and float(rows[0]["segm/APr"]) == 3.0  # (1 + 2 + 6) / 3
    assert float(rows[0]["segm/AP std"]) == 2.0  # sample std of 10, 12, 14
    assert (rows[0]["segm/APr min"], rows[0]["segm/APr max"]) == ("1.0", "6.0")
    assert float(rows[1]["segm/AP"]) == 18.0 and float(rows[1]["segm/APr"]) == 4.0
    assert "| t=0 | 3 | 0 | 12.00 (10.00-14.00) | 3.00 (1.00-6.00) |" in table
    assert "| t=0.1 | 2 | 1 | 18.00 (16.00-20.00) | 4.00 (3.00-5.00) |" in table
    assert (tmp_path / "summary.md").read_text() == table


def test_no_seed_table_without_a_seed_override(tmp_path):
    make_job(tmp_path, 0, ["t=0"], {"segm/AP": 1.0})
    make_job(tmp_path, 1, ["t=0.1"], {"segm/AP": 2.0})
    table, _ = write_summary(str(tmp_path))
    assert "over train.seed" not in table and not (tmp_path / "summary_seeds.csv").exists()


def test_summary_plot_is_written_for_a_seeded_threshold_sweep(tmp_path):
    for job, (t, seed) in enumerate((t, s) for t in ("0", "0.01", "0.1") for s in (0, 1)):
        metrics = {
            f"{task}/{n}": 10.0 + job for task in ("segm", "bbox") for n in ("AP", "APr", "APc", "APf")
        }
        make_job(tmp_path, job, [f"t={t}", f"train.seed={seed}"], metrics)
    _, rows = write_summary(str(tmp_path))
    path = write_summary_plot(str(tmp_path), rows)
    assert path == str(tmp_path / "summary.png") and os.path.getsize(path) > 10_000
    with Image.open(path) as image:
        assert image.width > image.height > 300


def test_no_summary_plot_when_only_the_seed_varies(tmp_path):
    for seed in (0, 1):
        make_job(tmp_path, seed, [f"train.seed={seed}"], {"segm/AP": 1.0})
    _, rows = write_summary(str(tmp_path))
    assert write_summary_plot(str(tmp_path), rows) is None and not (tmp_path / "summary.png").exists()
