from tests.scripts.loading import load_script


def test_reference_step_is_timed_and_reported(capsys):
    result = load_script("machine_speed").main(["--threads", "1", "--repeats", "2", "--size", "32"])
    out = capsys.readouterr().out
    assert 0 < result["best_ms"] <= result["median_ms"] < 60_000
    assert f"best {result['best_ms']:.1f} ms" in out and "1 threads" in out and "load average" in out
