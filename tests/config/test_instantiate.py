import functools

import pytest
from omegaconf import DictConfig, OmegaConf

from lazytrain.config import InstantiationError, L, LazyConfig, instantiate
from tests.config import helpers


def test_nested_and_lists_become_plain_python():
    cfg = L(helpers.record)(items=[L(helpers.Point)(x=1), {"k": L(helpers.Point)(y=2)}], opts={"a": [1, 2]})
    built = instantiate(cfg)
    assert built["items"] == [helpers.Point(1, 0), {"k": helpers.Point(0, 2)}]
    assert type(built["opts"]) is dict and type(built["opts"]["a"]) is list


def test_convert_none_keeps_config_containers():
    built = instantiate(L(helpers.record)(opts={"a": 1}, _convert_="none"))
    assert isinstance(built["opts"], DictConfig)


def test_partial():
    fn = instantiate(L(helpers.add)(b=2, _partial_=True))
    assert isinstance(fn, functools.partial)
    assert fn(1) == 3


def test_args():
    assert instantiate(L(helpers.add)(2, 3, scale=2)) == 10


def test_recursive_false_passes_nodes():
    built = instantiate(L(helpers.record)(child=L(helpers.Point)(x=1), _recursive_=False))
    assert isinstance(built["child"], DictConfig)
    assert instantiate(built["child"]) == helpers.Point(1, 0)


def test_lazy_target_is_built_then_called():
    cfg = {"_target_": L(helpers.make_adder)(offset=10), "_args_": [5]}
    assert instantiate(cfg) == 15


def test_node_shared_by_interpolation_is_built_once():
    cfg = OmegaConf.create(
        {
            "dataloader": {
                "train": L(helpers.Loader)(
                    dataset=L(helpers.make_dataset)(size=4),
                    sampler=L(helpers.Sampler)(dataset_dicts="${..dataset}"),
                )
            }
        }
    )
    loader = instantiate(cfg.dataloader.train)
    assert helpers.CALLS["make_dataset"] == 1
    assert loader.sampler.dataset_dicts is loader.dataset


def test_shared_node_survives_save_and_reload(tmp_path):
    cfg = OmegaConf.create({"a": L(helpers.make_dataset)(), "b": L(helpers.record)(x="${a}", y="${a}")})
    LazyConfig.save(cfg, str(tmp_path / "c.yaml"))
    built = instantiate(LazyConfig.load(str(tmp_path / "c.yaml")))
    assert helpers.CALLS["make_dataset"] == 1
    assert built["b"]["x"] is built["b"]["y"] is built["a"]


def test_extra_kwargs_override_and_pass_as_is():
    model = object()
    loader = instantiate(L(helpers.Loader)(dataset=None, sampler="???", batch_size=3), sampler=model)
    assert loader.sampler is model and loader.batch_size == 3


def test_objects_and_plain_values_pass_through():
    marker = object()
    assert instantiate(5) == 5
    assert instantiate({"a": marker})["a"] is marker


def test_error_names_key_path_and_target_and_chains_cause():
    cfg = OmegaConf.create({"outer": {"inner": L(helpers.failing)(value=3)}})
    with pytest.raises(InstantiationError) as info:
        instantiate(cfg.outer)
    message = str(info.value)
    assert "'outer.inner'" in message
    assert "tests.config.helpers.failing" in message
    assert "boom 3" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_value_error_names_key():
    cfg = OmegaConf.create({"m": L(helpers.add)(a="???")})
    with pytest.raises(InstantiationError, match=r"m\.a"):
        instantiate(cfg.m)


def test_non_importable_target_error():
    with pytest.raises(InstantiationError, match="no attribute 'nothing'"):
        instantiate({"x": {"_target_": "tests.config.helpers.nothing"}})


def test_convert_is_inherited_by_children_unless_they_set_their_own():
    cfg = L(helpers.record)(
        inherits=L(helpers.record)(opts={"a": 1}),
        own=L(helpers.record)(opts={"a": 1}, _convert_="all"),
        _convert_="none",
    )
    built = instantiate(cfg)
    assert isinstance(built["inherits"]["opts"], DictConfig)
    assert type(built["own"]["opts"]) is dict


@pytest.mark.parametrize("mode", ["all", "partial", "object"])
def test_convert_modes_give_plain_containers(mode):
    built = instantiate(L(helpers.record)(opts={"a": [1, {"b": 2}]}, _convert_=mode))
    assert built == {"opts": {"a": [1, {"b": 2}]}}
    assert type(built["opts"]["a"]) is list and type(built["opts"]["a"][1]) is dict


def test_invalid_convert_names_key_path():
    cfg = OmegaConf.create({"m": L(helpers.record)(_convert_="everything")})
    with pytest.raises(InstantiationError, match=r"'m' .*_convert_ must be one of"):
        instantiate(cfg.m)


def test_special_keys_given_as_kwargs_configure_the_call():
    fn = instantiate(L(helpers.add)(b=2), _partial_=True)
    assert isinstance(fn, functools.partial) and fn(1) == 3
    assert instantiate(L(helpers.add)(1, 2), _args_=[5]) == 5
    assert instantiate(L(helpers.add)(a=1), _target_=helpers.record, b=3) == {"a": 1, "b": 3}


def test_top_level_container_convert_none():
    built = instantiate({"a": {"b": L(helpers.Point)(x=1)}}, _convert_="none")
    assert isinstance(built, DictConfig) and built.a.b == helpers.Point(1, 0)


def test_kwargs_for_config_without_target_are_an_error():
    with pytest.raises(TypeError, match=r"this config has none; got \['model'\]"):
        instantiate({"a": 1}, model=object())


def test_extra_kwargs_are_not_converted():
    opts = {"a": [1]}
    assert instantiate(L(helpers.record)(), opts=opts)["opts"] is opts


def test_plain_dict_with_target_and_list_at_top_level():
    assert instantiate({"_target_": "tests.config.helpers.add", "a": 1, "b": 2}) == 3
    assert instantiate([L(helpers.add)(1), {"_target_": "tests.config.helpers.Point"}]) == [
        1,
        helpers.Point(),
    ]


def test_shared_list_of_calls_is_built_once():
    cfg = OmegaConf.create(
        {
            "datasets": [L(helpers.make_dataset)(size=1), L(helpers.make_dataset)(size=2)],
            "user": L(helpers.record)(a="${datasets}", b="${datasets[1]}"),
            "other": L(helpers.record)(c="${datasets}"),
        }
    )
    built = instantiate(cfg)
    assert helpers.CALLS["make_dataset"] == 2
    assert built["user"]["a"][1] is built["user"]["b"] is built["other"]["c"][1] is built["datasets"][1]


def test_separate_instantiate_calls_build_separately():
    cfg = OmegaConf.create({"a": L(helpers.make_dataset)(), "b": L(helpers.record)(x="${a}")})
    first, second = instantiate(cfg.b), instantiate(cfg.b)
    assert helpers.CALLS["make_dataset"] == 2
    assert first["x"] == second["x"] and first["x"] is not second["x"]


def test_error_in_shared_node_names_the_node_itself():
    cfg = OmegaConf.create({"data": {"a": L(helpers.failing)(value=1), "b": L(helpers.record)(x="${..a}")}})
    with pytest.raises(InstantiationError, match=r"error instantiating 'data\.a' \(_target_: tests\.config"):
        instantiate(cfg.data.b)


def test_error_in_args_names_index():
    cfg = OmegaConf.create({"m": L(helpers.add)(L(helpers.failing)(value=2))})
    with pytest.raises(InstantiationError, match=r"'m\._args_\[0\]'.*boom 2"):
        instantiate(cfg)


def test_error_in_lazy_target_names_target_key():
    cfg = OmegaConf.create({"m": {"_target_": L(helpers.failing)(value=4), "_args_": [1]}})
    with pytest.raises(InstantiationError, match=r"'m\._target_'.*boom 4"):
        instantiate(cfg)


def test_non_callable_target_is_named():
    with pytest.raises(
        InstantiationError, match=r"'<root>' \(_target_: tests\.config\.helpers\.CALLS\).*must be callable"
    ):
        instantiate({"_target_": "tests.config.helpers.CALLS"})
