import inspect
import os
import subprocess
import sys

import pytest
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import ConfigError, L, LazyConfig, find_problems, locate, tree, validate
from lazytrain.config.lazy import RESERVED_KEYS
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
        "d.x=${nowhere.key}: cannot resolve the interpolation: Interpolation key 'nowhere.key' not found. "
        "Point it at an existing key or give a plain value.",
        "e[0].xx: tests.config.helpers.Point has no argument 'xx'. Did you mean 'x'? Accepted: x, y.",
    ]


def test_references_to_a_missing_value_or_to_a_resolver_of_hydra_are_not_dangling():
    """Before Hydra runs, ``${hydra:...}`` has no resolver; a ``???`` is reported once, at its own key."""
    cfg = OmegaConf.create(
        {
            "train": {"output_dir": "${hydra:runtime.output_dir}", "json": "???"},
            "hook": L(helpers.record)(out="${train.output_dir}", json="${train.json}", bad="${train.nope}"),
        }
    )
    assert find_problems(cfg) == [
        "train.json: mandatory value is missing (???). Set it: train.json=VALUE",
        "hook.bad=${train.nope}: cannot resolve the interpolation: Interpolation key 'train.nope' not found. "
        "Point it at an existing key or give a plain value.",
    ]


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


CONFIGS = sorted(
    name for name in os.listdir(os.path.join(REPO, "conf")) if name.endswith(".py") and name != "__init__.py"
)


def _call_nodes(cfg):
    """(key path, node) of every call node whose target is a dotted path."""
    for path, node in tree.nodes(cfg):
        is_call = isinstance(node, DictConfig) and isinstance(tree.raw_target(node), str)
        if is_call and not tree.is_interpolation(tree.child(node, "_target_")):
            yield path, node


def _misspell(node):
    """(a misspelled argument name, the name it should suggest, or None for a new name)."""
    given = [str(k) for k in node.keys() if k not in RESERVED_KEYS]
    if not given:
        params = inspect.signature(locate(node._target_)).parameters.values()
        given = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not given:
        return "unknown_argument", None
    key = given[-1]
    return key + key[-1], key  # a doubled last letter: lrr, batch_size_per_imagee


@pytest.mark.parametrize("name", CONFIGS)
def test_every_call_of_every_config_names_a_misspelled_argument(name):
    """Each call node of the config gets one misspelled argument; validation names each with the fix, whatever
    the target's signature (a class passing ``**kwargs`` on to its base included)."""
    from lazytrain.program.default import INJECTED_ARGUMENTS

    cfg = LazyConfig.load(os.path.join(REPO, "conf", name))
    before = set(find_problems(cfg, INJECTED_ARGUMENTS))
    expected = {}
    for path, node in list(_call_nodes(cfg)):
        bad, suggestion = _misspell(node)
        node[bad] = 0
        hint = f" Did you mean '{suggestion}'?" if suggestion else ""
        expected[f"{path}.{bad}"] = f"{path}.{bad}: {node._target_} has no argument '{bad}'.{hint}"
    assert len(expected) >= 10
    new = sorted(set(find_problems(cfg, INJECTED_ARGUMENTS)) - before)
    found = {line.split(":", 1)[0]: line for line in new}
    assert sorted(found) == sorted(expected), new
    for key, start in expected.items():
        assert found[key].startswith(start), found[key]
