import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from lazytrain.config import ConfigError, L, find_problems, validate
from tests.config import helpers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_valid_config_passes():
    cfg = OmegaConf.create({"loader": L(helpers.Loader)(dataset=L(helpers.make_dataset)(), sampler=None)})
    validate(cfg)


def test_reports_all_problems_at_once_with_paths_and_suggestion():
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": {
                    "sampler": L(helpers.Sampler)(dataset_dicts=[], repeat_tresh=0.1),
                    "bad": {"_target_": "tests.config.helpers.does_not_exist"},
                }
            },
            "model": L(helpers.add)(),
            "opt": {"lr": "???"},
        }
    )
    problems = find_problems(cfg)
    joined = "\n".join(problems)
    assert (
        "dataloader.train.sampler.repeat_tresh: tests.config.helpers.Sampler has no argument 'repeat_tresh'. Did you mean 'repeat_thresh'?"
        in joined
    )
    assert "dataloader.train.bad._target_: cannot import 'tests.config.helpers.does_not_exist'" in joined
    assert "model.a: missing required argument 'a'" in joined
    assert "opt.lr: mandatory value is missing" in joined
    assert len(problems) == 4
    with pytest.raises(ConfigError, match="4 problem"):
        validate(cfg)


def test_injected_arguments_are_not_missing():
    cfg = OmegaConf.create({"train": {"trainer": L(helpers.Loader)()}})
    assert len(find_problems(cfg)) == 2
    assert find_problems(cfg, injected={"train.trainer": ["dataset", "sampler"]}) == []


def test_type_mismatch_for_simple_annotation():
    cfg = OmegaConf.create({"s": L(helpers.Sampler)(dataset_dicts=[], repeat_thresh="high", seed=1.5)})
    problems = find_problems(cfg)
    assert any("s.repeat_thresh" in p and "expected float, got str" in p for p in problems)
    assert any("s.seed" in p and "expected int, got float" in p for p in problems)


def test_interpolations_are_not_checked_twice():
    cfg = OmegaConf.create({"a": L(helpers.make_dataset)(sizes=1), "b": L(helpers.record)(x="${a}")})
    assert len(find_problems(cfg)) == 1


def test_more_problems_each_with_key_path():
    cfg = OmegaConf.create(
        {
            "a": L(helpers.add)(1, 2, 3),
            "b": L(helpers.record)(_partial_="yes", _convert_="everything"),
            "c": {"_target_": "tests.config.helpers.CALLS"},
            "d": L(helpers.record)(x="${nowhere.key}", y="${..a}", z="${oc.env:NOT_SET_ANYWHERE,1}"),
            "e": [L(helpers.Point)(xx=1)],
        }
    )
    problems = find_problems(cfg)
    assert problems == [
        "a._args_: tests.config.helpers.add takes 2 positional argument(s); got 3.",
        "b._partial_: must be true or false; got 'yes'.",
        "b._convert_: must be one of none, partial, object, all; got 'everything'.",
        "c._target_: 'tests.config.helpers.CALLS' is not callable (a Counter).",
        "d.x: interpolation ${nowhere.key} does not resolve: "
        + problems[4].split("does not resolve: ", 1)[-1],
        "e[0].xx: tests.config.helpers.Point has no argument 'xx'. Did you mean 'x'? Accepted: x, y.",
    ]
    assert "nowhere" in problems[4]


def test_missing_value_for_injected_argument_is_fine():
    cfg = OmegaConf.create({"train": {"trainer": L(helpers.Loader)(dataset="???", sampler="???")}})
    assert len(find_problems(cfg)) == 2
    assert find_problems(cfg, injected={"train.trainer": ["dataset", "sampler"]}) == []


def test_lazy_target_node_is_checked():
    cfg = OmegaConf.create({"m": {"_target_": L(helpers.make_adder)(ofset=1), "_args_": [1]}})
    assert find_problems(cfg) == [
        "m._target_.ofset: tests.config.helpers.make_adder has no argument 'ofset'. Did you mean 'offset'? "
        "Accepted: offset.",
        "m._target_.offset: missing required argument 'offset' of tests.config.helpers.make_adder.",
    ]


def test_validate_does_not_import_torch():
    code = (
        "import sys\n"
        "from omegaconf import OmegaConf\n"
        "from lazytrain.config import L, validate, LazyConfig\n"
        "from tests.config import helpers\n"
        "cfg = OmegaConf.create({'s': L(helpers.Sampler)(dataset_dicts=[])})\n"
        "validate(cfg)\n"
        "LazyConfig.apply_overrides(cfg, ['++s.seed=3'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
