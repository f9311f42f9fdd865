import pickle
import subprocess
import sys

import pytest
from omegaconf import DictConfig

from lazytrain.config import ConfigError, L, LazyCall, instantiate, locate
from tests.config import helpers


def test_lazycall_stores_dotted_target_and_args():
    node = L(helpers.add)(1, b=2, scale=3)
    assert isinstance(node, DictConfig)
    assert node._target_ == "tests.config.helpers.add"
    assert list(node._args_) == [1]
    assert node.b == 2 and node.scale == 3
    assert instantiate(node) == 9


def test_lazycall_node_pickles_as_plain_data():
    node = L(helpers.Loader)(dataset=L(helpers.make_dataset)(size=4), sampler=None)
    again = pickle.loads(pickle.dumps(node))
    assert again == node
    assert instantiate(again).dataset == [0, 1, 2, 3]


def test_classmethod_target_round_trips():
    node = L(dict.fromkeys)(["a", "b"], 0)
    assert node._target_ == "builtins.dict.fromkeys"
    assert instantiate(node) == {"a": 0, "b": 0}
    node = L(helpers.Registry.from_size)(size=3)
    assert node._target_ == "tests.config.helpers.Registry.from_size"
    assert instantiate(node).size == 3


@pytest.mark.parametrize(
    "target, message",
    [
        pytest.param(lambda x: x, "lambda or local function", id="lambda"),
        pytest.param(helpers.make_adder(1), "lambda or local function", id="local-function"),
        pytest.param(3, "importable class or function", id="not-callable"),
        pytest.param(
            helpers.REPLACED_BEFORE,
            r"its dotted path 'tests\.config\.helpers\.replaced' imports a different object",
            id="path-names-another-object",
        ),
        pytest.param(
            helpers.Registry().from_size.__func__, "imports a different object", id="unbound-classmethod"
        ),
    ],
)
def test_lazycall_rejects_non_importable_targets(target, message):
    with pytest.raises(ConfigError, match=message):
        LazyCall(target)


def test_lazycall_converts_dataclass_and_classes_passed_as_values():
    node = L(helpers.record)(point=helpers.Point(1, 2), factory=helpers.Point)
    assert node.point._target_ == "tests.config.helpers.Point"
    built = instantiate(node)
    assert built["point"] == helpers.Point(1, 2)
    assert built["factory"] is helpers.Point


def test_lazycall_rejects_unrepresentable_value_naming_argument():
    with pytest.raises(ConfigError, match="weights: a config cannot hold"):
        L(helpers.record)(weights=object())


def test_locate_names_missing_attribute():
    with pytest.raises(ImportError, match="'tests.config.helpers' has no attribute 'nope'"):
        locate("tests.config.helpers.nope")


def test_locate_of_a_missing_module_says_where_python_looks():
    # A user's printed Evaluate: command run from another folder than the one holding their module.
    with pytest.raises(
        ImportError,
        match=r"^cannot import 'shapes_nowhere.register_shapes': no module named 'shapes_nowhere'\. Run from the "
        r"folder that holds your modules \(python -m puts the current folder on the import path\) or add it "
        r"to PYTHONPATH\.$",
    ):
        locate("shapes_nowhere.register_shapes")


def test_import_config_does_not_import_torch():
    code = "import sys, lazytrain.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "value, message",
    [
        pytest.param(b"xy", r"weights: a config cannot hold b'xy' \(type bytes\)", id="bytes"),
        pytest.param({1, 2}, r"weights: a config cannot hold \{1, 2\} \(type set\)", id="set"),
        pytest.param(helpers.Registry(), r"weights: a config cannot hold .* \(type Registry\)", id="object"),
        pytest.param(
            [1, helpers.make_adder(1)], r"weights\[1\]: LazyCall target .* local function", id="local"
        ),
    ],
)
def test_lazycall_values_a_config_cannot_hold_name_the_argument(value, message):
    with pytest.raises(ConfigError, match=message):
        L(helpers.record)(weights=value)


def test_tuples_become_lists_and_nested_dataclass_fields_convert():
    node = L(helpers.record)(size=(2, 3), outer=helpers.Point(x=helpers.Point(1, 2)))
    assert list(node.size) == [2, 3]
    assert node.outer.x._target_ == "tests.config.helpers.Point"
    assert instantiate(node) == {"size": [2, 3], "outer": helpers.Point(helpers.Point(1, 2), 0)}


def test_torch_dtype_value_round_trips_as_the_same_object():
    torch = pytest.importorskip("torch")
    node = L(helpers.record)(dtype=torch.float16)
    assert node.dtype == {"_target_": "lazytrain.config.lazy.locate", "_args_": ["torch.float16"]}
    assert instantiate(node)["dtype"] is torch.float16
