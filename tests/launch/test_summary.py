"""The sweep summary table: rows per job, only the overrides that vary, metrics in reading order."""

import json
import os

from lazytrain.launch.summary import write_summary


def make_job(sweep_dir, job, overrides, metrics, status="ok", seconds=12.5):
    job_dir = sweep_dir / str(job)
    os.makedirs(job_dir / ".hydra")
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job_dir / "lazytrain_job.json").write_text(json.dumps({"status": status, "seconds": seconds}))
    lines = [{"iteration": 9, "total_loss": 1.0}, {"iteration": 10, **metrics}]
    (job_dir / "metrics.json").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_summary_orders_metrics_and_drops_shared_overrides(tmp_path):
    names = ["APl", "AP50", "APr", "AP", "APf", "APc"]
    make_job(tmp_path, 0, ["t=0", "seed=1"], {f"{task}/{n}": 1.0 for task in ("bbox", "segm") for n in names})
    make_job(tmp_path, 1, ["t=0.1", "seed=1"], {"segm/AP": 2.0, "bbox/AP": 3.0}, status="failed")
    table, rows = write_summary(str(tmp_path))

    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    expected = ["AP", "APr", "APc", "APf", "AP50", "APl"]
    assert header == ["job", "overrides", "status", "seconds"] + [
        f"{t}/{n}" for t in ("segm", "bbox") for n in expected
    ]
    assert [row["overrides"] for row in rows] == ["t=0", "t=0.1"]
    assert "| 1 | t=0.1 | failed | 12.50 | 2.00 |" in table
    assert (tmp_path / "summary.md").read_text() == table
