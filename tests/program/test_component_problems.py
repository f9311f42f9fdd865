"""`find_component_problems`: the repeat-factor threshold a config sets, checked before a run starts."""

import pytest
from omegaconf import OmegaConf

from lazytrain.program.preflight.components import find_component_problems


def _config(repeat_thresh):
    return OmegaConf.create({"dataloader": {"train": {"sampler": {"repeat_thresh": repeat_thresh}}}})


@pytest.mark.parametrize("value", [0, 0.001, 1, [0.3, None], [0, 0.01], "${oc.env:T,0.1}"])
def test_a_threshold_or_one_per_source_is_accepted(value):
    assert find_component_problems(_config(value)) == []


@pytest.mark.parametrize("value", [-1, True, "high", [0.3, -0.1], [0.3, "x"]])
def test_anything_else_is_one_line_naming_the_key(value):
    problems = find_component_problems(_config(value))
    assert len(problems) == 1
    assert problems[0].startswith("dataloader.train.sampler.repeat_thresh=")
    assert "one per source" in problems[0]


def _demo_with_copy_paste(**settings):
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": {"mapper": {"copy_paste": {"_target_": "lazytrain.data.copy_paste.CopyPaste"}}}
            }
        }
    )
    cfg.dataloader.train.mapper.copy_paste.update(settings)
    return cfg


def test_copy_paste_settings_it_would_refuse_are_one_line_each():
    problems = find_component_problems(_demo_with_copy_paste(mode="rar", prob=1.5, max_objects=20))
    assert len(problems) == 2
    assert problems[0].startswith("dataloader.train.mapper.copy_paste.mode='rar': must be one of 'none'")
    assert problems[1].startswith("dataloader.train.mapper.copy_paste.prob=1.5: must be a number in [0, 1]")


def test_copy_paste_settings_it_takes_pass():
    assert (
        find_component_problems(_demo_with_copy_paste(mode="rare", prob=0.5, min_area="${oc.env:X,4}")) == []
    )


def test_a_names_list_with_a_registering_call_is_checked_without_error(tmp_path, monkeypatch):
    """A list of data set names may hold `register_json_dataset` calls (the config's own json files): the
    built-in data check looks at the names only (it used to fail on the call with a traceback)."""
    from lazytrain.program.preflight.builtin_data import find_missing_data

    monkeypatch.setenv("LAZYTRAIN_DATASETS", str(tmp_path))
    register = {"_target_": "lazytrain.data.datasets.custom.register_json_dataset", "name": "mine"}
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": {
                    "dataset": {
                        "_target_": "lazytrain.data.build.get_detection_dataset_dicts",
                        "names": ["lvis_v1_train", register],
                    }
                }
            }
        }
    )
    (problem,) = find_missing_data(cfg)
    assert problem.startswith("data set 'lvis_v1_train' is not on disk")


@pytest.mark.parametrize(
    "target", ["lvis_evaluation.LVISEvaluator", "long_tail_evaluation.LongTailEvaluator"]
)
def test_ap_fixed_budget_it_would_refuse_is_one_line(target):
    evaluator = {"_target_": f"lazytrain.evaluation.{target}", "max_dets_per_category": -5}
    (problem,) = find_component_problems(OmegaConf.create({"dataloader": {"evaluator": evaluator}}))
    assert problem.startswith("dataloader.evaluator.max_dets_per_category=-5: must be an integer >= 1")
    evaluator["max_dets_per_category"] = 300
    assert find_component_problems(OmegaConf.create({"dataloader": {"evaluator": evaluator}})) == []
