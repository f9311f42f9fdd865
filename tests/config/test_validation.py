import pytest
from omegaconf import OmegaConf

from lazytrain.config import ConfigError, L, find_problems, validate
from tests.config import helpers


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
