"""Evaluating a finished run with the command its closing block prints: the results land in a dated sub-folder
of the run (never over the training's files), between a header and a closing block as training has."""

import os
import re
import shlex

import pytest

from tests.launch.test_entrypoint import ENGINE_TOY, lazytrain


def test_the_printed_evaluate_command_evaluates_into_the_run_folder_with_a_header_and_closing_block(tmp_path):
    run_dir = tmp_path / "run"
    trained = lazytrain(ENGINE_TOY, "train.max_iter=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    output = trained.stdout + trained.stderr
    # The toy's warm-up (5 iterations) outlasts this 2-iteration run: one warning, before the first step (the
    # peak, x0.2 of warm-up times x0.1 twice: both milestones of 2 iterations fall on iteration 1).
    warnings = re.findall(r"WARNING\] (lr_multiplier\.warmup_iters=.*)", output)
    assert warnings == [
        "lr_multiplier.warmup_iters=5 is longer than the run (train.max_iter=2): the learning rate peaks at "
        "2.01e-05 (x0.002 of 0.01) and never reaches its value; shorten the warm-up (e.g. "
        "lr_multiplier.warmup_iters=1) or train longer."
    ]
    assert output.index("warmup_iters=5 is longer") < output.index("iter: 1")
    training_metrics = (run_dir / "metrics.json").read_text()

    (evaluate,) = re.findall(r"^Evaluate: +python -m lazytrain (.*)$", output, re.MULTILINE)
    evaluated = lazytrain(*shlex.split(evaluate), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (eval_dir,) = (run_dir / "eval").iterdir()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}", eval_dir.name)  # to the microsecond
    assert not (tmp_path / "outputs").exists()
    assert (run_dir / "metrics.json").read_text() == training_metrics
    assert '"toy/AP"' in (eval_dir / "metrics.json").read_text()

    output = evaluated.stdout + evaluated.stderr
    header = output[output.index("Evaluation:\n") :].splitlines()[1:7]
    assert [line.split()[0] for line in header] == ["command", "output", "world", "data", "model", "weights"]
    assert header[1].split()[1] == str(eval_dir)
    assert header[5].split() == ["weights", str(run_dir / "model_final.pth")]
    block = evaluated.stdout[evaluated.stdout.index("Done: evaluation in") :].splitlines()  # it ends stdout
    assert re.fullmatch(
        rf"Done: evaluation in 0:00:\d\d \(wall time\)\. Evaluation of {re.escape(str(run_dir))}/model_final\.pth "
        r"\(AP x100\):",
        block[0],
    )
    assert block[1].split() == ["AP", "AP50", "AP75"] and re.fullmatch(
        r"toy +\d+\.\d +- +-", block[2].strip()
    )
    assert block[3] == f"Files in {eval_dir}:"
    named = [line.split()[0] for line in block[4:]]
    assert named == ["metrics.json", "config.yaml", "log.txt"]
    assert all(os.path.isfile(eval_dir / name) for name in named)


def test_an_evaluation_into_the_trained_run_folder_is_refused_before_anything_is_written(tmp_path):
    from lazytrain.errors import ConfigError
    from lazytrain.program.default import INJECTED_ARGUMENTS
    from lazytrain.program.preflight import check_command_line
    from lazytrain.program.primary_config import DEFAULT_MAIN, load_primary_config

    cfg = load_primary_config(ENGINE_TOY)
    run = tmp_path / "run"
    run.mkdir()
    (run / "last_checkpoint").write_text("model_final.pth")
    (run / "config.yaml").write_text("trained: true\n")
    evaluate = ["train.eval_only=true"]
    with pytest.raises(ConfigError) as error:
        check_command_line(cfg, [*evaluate, f"hydra.run.dir={run}"], DEFAULT_MAIN, INJECTED_ARGUMENTS)
    assert str(error.value) == (
        f"hydra.run.dir={run}: holds a run ({run / 'last_checkpoint'}); an evaluation there would replace its "
        "config.yaml and mix its metrics.json. Evaluate into a folder of its own: "
        f"'hydra.run.dir={run}/eval/${{now:%Y-%m-%d_%H-%M-%S.%f}}' (what the run's closing block prints)."
    )
    assert (run / "config.yaml").read_text() == "trained: true\n"


def _check(tmp_path, *overrides, config_file=None):
    from lazytrain.program.default import INJECTED_ARGUMENTS
    from lazytrain.program.preflight import check_command_line
    from lazytrain.program.primary_config import DEFAULT_MAIN, load_primary_config

    cfg = load_primary_config(config_file or ENGINE_TOY)
    check_command_line(cfg, list(overrides), DEFAULT_MAIN, INJECTED_ARGUMENTS, config_file)


def _trained_run(folder):
    folder.mkdir()
    (folder / "last_checkpoint").write_text("model_final.pth")
    (folder / "model_final.pth").write_bytes(b"")
    (folder / "metrics.json").write_text('{"iteration": 1}\n')
    return folder


def test_an_evaluation_over_a_resumed_run_or_into_its_output_dir_is_refused(tmp_path):
    # A resumed run's config.yaml says train.resume=true: that must not let an evaluation append its line to
    # the run's metrics.json (failed before: the resume returned before eval_only was looked at).
    from lazytrain.errors import ConfigError

    run = _trained_run(tmp_path / "run")
    weights = f"train.init_checkpoint={run / 'model_final.pth'}"
    for where in (f"hydra.run.dir={run}", f"train.output_dir={run}"):
        with pytest.raises(ConfigError) as error:
            _check(tmp_path, "train.resume=true", "train.eval_only=true", weights, where)
        key = where.split("=")[0]
        (line,) = [line for line in str(error.value).splitlines() if line.startswith(f"{key}={run}:")]
        assert line.startswith(
            f"{key}={run}: holds a run ({run / 'last_checkpoint'}); an evaluation there would"
        )
    assert line.endswith(
        "(what the run's closing block prints) and 'train.output_dir=${hydra:runtime.output_dir}'."
    )
    assert (run / "metrics.json").read_text() == '{"iteration": 1}\n'


def test_an_evaluation_into_the_folder_of_an_earlier_evaluation_is_refused(tmp_path):
    # README's fixed eval/ap_fixed run twice appended to one metrics.json (failed before: it was let through).
    from lazytrain.errors import ConfigError

    earlier = tmp_path / "eval"
    earlier.mkdir()
    (earlier / "metrics.json").write_text("{}\n")
    with pytest.raises(ConfigError) as error:
        _check(tmp_path, "train.eval_only=true", f"hydra.run.dir={earlier}")
    assert str(error.value) == (
        f"hydra.run.dir={earlier}: holds an earlier evaluation ({earlier / 'metrics.json'}); another there would "
        "replace its config.yaml and append to its metrics.json. Choose another hydra.run.dir (a new folder) for "
        "this evaluation."
    )
    _check(tmp_path, "train.eval_only=true", f"hydra.run.dir={tmp_path / 'eval2'}")  # a new folder is fine


def test_an_evaluation_of_a_run_config_must_name_the_run_weights(tmp_path):
    # Its saved train.init_checkpoint is where the training started: evaluating it silently measured the
    # initial weights (failed before: no refusal).
    from lazytrain.config import LazyConfig
    from lazytrain.errors import ConfigError
    from lazytrain.program.primary_config import load_primary_config

    run = _trained_run(tmp_path / "run")
    config = run / "config.yaml"
    LazyConfig.save(load_primary_config(ENGINE_TOY), config)
    new_dir = f"hydra.run.dir={tmp_path / 'new'}"
    with pytest.raises(ConfigError) as error:
        _check(tmp_path, "train.eval_only=true", new_dir, config_file=str(config))
    assert str(error.value).startswith(
        f"train.eval_only=true with {config}, the config of the trained run in "
    )
    assert str(error.value).endswith(
        f"Name the weights to evaluate: train.init_checkpoint={run}/model_final.pth."
    )
    # Named on the command line (whatever they are), or in the file as a file of the run: evaluated as asked.
    from lazytrain.program.preflight.existing_runs import find_unnamed_run_weights_problems

    cfg = load_primary_config(str(config))
    named = ["train.eval_only=true", f"train.init_checkpoint={run}/model_final.pth"]
    assert (
        find_unnamed_run_weights_problems(LazyConfig.apply_overrides(cfg.copy(), named), named, str(config))
        == []
    )
    cfg.train.eval_only = True
    assert find_unnamed_run_weights_problems(cfg, [], str(config)) != []
    cfg.train.init_checkpoint = str(run / "model_0000009.pth")
    assert find_unnamed_run_weights_problems(cfg, [], str(config)) == []
    assert find_unnamed_run_weights_problems(cfg, [], ENGINE_TOY) == []  # not a run's config
