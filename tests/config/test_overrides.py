import pytest
from omegaconf import OmegaConf
from pytest import param

from lazytrain.config import ConfigError, L, LazyConfig, instantiate
from tests.config import helpers


@pytest.fixture
def cfg():
    return OmegaConf.create(
        {
            "dataloader": {
                "train": L(helpers.Loader)(
                    dataset=L(helpers.make_dataset)(size=5),
                    sampler=L(helpers.Sampler)(dataset_dicts="${..dataset}", repeat_thresh=0.001),
                )
            },
            "train": {
                "max_iter": 100,
                "lr": 0.1,
                "amp": False,
                "name": "run",
                "steps": [1, 2],
                "opts": {"a": 1, "b": 2},
            },
        }
    )


@pytest.mark.parametrize(
    "override, key, expected",
    [
        pytest.param("train.max_iter=7", "train.max_iter", 7, id="int"),
        pytest.param("train.lr=1e-3", "train.lr", 1e-3, id="float"),
        pytest.param("train.amp=true", "train.amp", True, id="bool"),
        pytest.param("train.name=null", "train.name", None, id="null"),
        pytest.param("train.name='10'", "train.name", "10", id="quoted-string"),
        pytest.param("train.steps=[3,4,5]", "train.steps", [3, 4, 5], id="list"),
        pytest.param(
            "dataloader.train.sampler.repeat_thresh=0.01",
            "dataloader.train.sampler.repeat_thresh",
            0.01,
            id="nested",
        ),
        pytest.param("+train.new_key=1", "train.new_key", 1, id="add"),
        pytest.param("+extra.deep.key=abc", "extra.deep.key", "abc", id="add-creates-parents"),
        pytest.param("++train.max_iter=9", "train.max_iter", 9, id="force-add-existing"),
        pytest.param("++train.other=9", "train.other", 9, id="force-add-new"),
    ],
)
def test_override_values_and_types(cfg, override, key, expected):
    LazyConfig.apply_overrides(cfg, [override])
    value = OmegaConf.select(cfg, key)
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    assert value == expected
    assert type(value) is type(expected)


def test_dict_override_merges(cfg):
    LazyConfig.apply_overrides(cfg, ["train.opts={b:3,c:4}"])
    assert OmegaConf.to_container(cfg.train.opts) == {"a": 1, "b": 3, "c": 4}


def test_interpolation_override(cfg):
    LazyConfig.apply_overrides(cfg, ["train.lr=${train.max_iter}"])
    assert cfg.train.lr == 100
    LazyConfig.apply_overrides(cfg, ["train.max_iter=5"])
    assert cfg.train.lr == 5


def test_delete(cfg):
    LazyConfig.apply_overrides(cfg, ["~train.amp", "~train.opts.a"])
    assert "amp" not in cfg.train and "a" not in cfg.train.opts


def test_delete_with_value_must_match(cfg):
    with pytest.raises(ConfigError, match="nothing deleted"):
        LazyConfig.apply_overrides(cfg, ["~train.max_iter=3"])
    LazyConfig.apply_overrides(cfg, ["~train.max_iter=100"])
    assert "max_iter" not in cfg.train


def test_override_changes_what_instantiate_builds(cfg):
    LazyConfig.apply_overrides(
        cfg, ["dataloader.train.dataset.size=2", "dataloader.train.sampler.repeat_thresh=0.5"]
    )
    loader = instantiate(cfg.dataloader.train)
    assert loader.dataset == [0, 1]
    assert loader.sampler.repeat_thresh == 0.5


def test_unknown_key_names_key_and_suggests(cfg):
    with pytest.raises(ConfigError) as info:
        LazyConfig.apply_overrides(cfg, ["dataloader.train.sampler.repeat_tresh=0.1"])
    message = str(info.value)
    assert "'dataloader.train.sampler.repeat_tresh' is not in the config" in message
    assert "Did you mean: dataloader.train.sampler.repeat_thresh" in message


def test_unknown_top_level_key_suggests_by_leaf_name(cfg):
    with pytest.raises(ConfigError, match=r"Did you mean: train\.max_iter"):
        LazyConfig.apply_overrides(cfg, ["max_iter=3"])


def test_unknown_key_with_a_near_miss_does_not_offer_to_add_it(cfg):
    with pytest.raises(ConfigError) as info:
        LazyConfig.apply_overrides(cfg, ["train.max_iters=3"])
    assert "Did you mean: train.max_iter" in str(info.value) and "+train.max_iters" not in str(info.value)
    with pytest.raises(ConfigError, match=r"To add a new key use '\+train\.warmup=\.\.\.'"):
        LazyConfig.apply_overrides(cfg, ["train.warmup=3"])


@pytest.mark.parametrize("typo", ["max_iters", "max_itr", "mxa_iter", "Max_Iter"])
def test_adding_a_plain_value_one_typo_from_an_existing_key_is_refused(cfg, typo):
    # It would train with train.max_iter's value: the typo is not read by anything.
    with pytest.raises(ConfigError) as info:
        LazyConfig.apply_overrides(cfg, [f"+train.{typo}=3"])
    assert str(info.value) == (
        f"override '+train.{typo}=3': adds 'train.{typo}' beside the existing 'train.max_iter', one typo apart: "
        f"the run would keep train.max_iter's value. Did you mean 'train.max_iter=3'? To add the new key anyway "
        f"use '++train.{typo}=3'."
    )
    assert cfg.train.max_iter == 100 and typo not in cfg.train


@pytest.mark.parametrize(
    "override",
    [
        "++train.max_iters=3",  # asked for explicitly
        "+train.name2=x",  # a digit: a second of its kind
        "+train.opts.c=1",  # no sibling near
        "+train.amps={_target_: builtins.dict}",  # a component builds something: never silent
        "+dataloader.train.sampler.repeat_tresh=1",  # a component's arguments are checked against its signature
    ],
)
def test_adding_near_an_existing_key_is_allowed_when_it_is_no_typo(cfg, override):
    LazyConfig.apply_overrides(cfg, [override])
    assert OmegaConf.select(cfg, override.lstrip("+").split("=")[0]) is not None


def test_add_existing_key_is_error(cfg):
    with pytest.raises(ConfigError, match=r"'train\.lr' already exists"):
        LazyConfig.apply_overrides(cfg, ["+train.lr=1"])


@pytest.mark.parametrize(
    "override, message",
    [
        pytest.param("train.max_iter.x=1", r"'train\.max_iter' holds a plain value \(int 100\)", id="int"),
        pytest.param("+train.name.x.y=1", r"'train\.name' holds a plain value \(str 'run'\)", id="add-deep"),
        pytest.param("train.steps.0.x=1", r"'train\.steps\.0' holds a plain value \(int 1\)", id="list-item"),
        pytest.param("~train.lr.x", r"'train\.lr' holds a plain value \(float 0\.1\)", id="delete"),
    ],
)
def test_override_inside_non_config_value_is_error(cfg, override, message):
    with pytest.raises(ConfigError, match=message + ", not a config node"):
        LazyConfig.apply_overrides(cfg, [override])


def test_override_through_interpolation_is_error_naming_the_shared_key(cfg):
    expected = (
        "'dataloader.train.sampler.dataset_dicts' is an interpolation (${..dataset}) of "
        "'dataloader.train.dataset'. Override 'dataloader.train.dataset.size' to change the shared value"
    )
    with pytest.raises(ConfigError) as info:
        LazyConfig.apply_overrides(cfg, ["dataloader.train.sampler.dataset_dicts.size=2"])
    assert expected in str(info.value)
    assert OmegaConf.is_interpolation(cfg.dataloader.train.sampler, "dataset_dicts")


def test_replacing_an_interpolation_as_a_whole_is_allowed(cfg):
    LazyConfig.apply_overrides(cfg, ["dataloader.train.sampler.dataset_dicts=[1]"])
    assert list(cfg.dataloader.train.sampler.dataset_dicts) == [1]


def test_list_items_can_be_set_and_deleted(cfg):
    LazyConfig.apply_overrides(cfg, ["train.steps.0=9", "~train.steps.1"])
    assert list(cfg.train.steps) == [9]


def test_overrides_apply_in_order(cfg):
    LazyConfig.apply_overrides(cfg, ["+train.extra=1", "train.extra=2", "++train.extra=3"])
    assert cfg.train.extra == 3


def test_delete_unknown_key_suggests(cfg):
    with pytest.raises(
        ConfigError, match=r"cannot delete 'train\.max_iters', no such key\. Did you mean: train\.max_iter"
    ):
        LazyConfig.apply_overrides(cfg, ["~train.max_iters"])


def test_omegaconf_failure_names_the_override(cfg):
    with pytest.raises(ConfigError, match=r"override '\+train\.steps\.5=1' failed: .*out of range"):
        LazyConfig.apply_overrides(cfg, ["+train.steps.5=1"])


@pytest.mark.parametrize("sweep", ["train.lr=0.1,0.2", "train.max_iter=range(1,3)", "train.lr=choice(1,2)"])
def test_sweep_syntax_asks_for_multirun(cfg, sweep):
    with pytest.raises(ConfigError, match="-m/--multirun"):
        LazyConfig.apply_overrides(cfg, [sweep])


def test_unparsable_override(cfg):
    with pytest.raises(ConfigError, match="cannot parse override"):
        LazyConfig.apply_overrides(cfg, ["train.lr"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        param(
            "train.steps=[1,", "the '[' at character 13 is never closed; close it with ']'", id="open-list"
        ),
        param(
            "train.opts={a:1", "the '{' at character 12 is never closed; close it with '}'", id="open-dict"
        ),
        param(
            "train.name='run",
            "the quote ' at character 12 is never closed; close it, or write \\' in text",
            id="quote",
        ),
        param(
            "train.steps=[1,2)",
            "the '[' at character 13 is closed by ')' at 17; close it with ']'",
            id="mixed",
        ),
        param(
            "train.steps=[1]]",
            "the ']' at character 16 closes nothing; remove it, or quote a value",
            id="stray",
        ),
        param(
            "train.lr=0.1,",
            "it ends with ',' (a sweep has a value after each ',': -m train.lr=1,2)",
            id="comma",
        ),
        param("train..lr=1", "'train..lr' is not a key path", id="bad-key"),
        param(
            "train.name=a=b",
            "Hydra's grammar reads no value in it (mismatched input '='); quote",
            id="equals",
        ),
        param("train.lr", "no '=' (set a key with train.lr=VALUE, delete it with ~train.lr)", id="no-equals"),
        param(
            "~train.lr 0.1",
            "a space between '~train.lr' and '0.1' (an override is one word): delete the key with ~train.lr, "
            "or with ~train.lr=0.1 only while it holds 0.1",
            id="delete-with-a-space",
        ),
        param(
            "train.lr 0.1",
            "a space between 'train.lr' and '0.1' (an override is one word): write train.lr=0.1",
            id="set-with-a-space",
        ),
        param(
            "train.name='C:\\'",
            "the quote ' at character 12 is never closed: the \\ before the last ' escapes it; write a backslash "
            "just before a closing quote as \\\\: train.name='C:\\\\'",
            id="backslash-before-closing-quote",
        ),
    ],
)
def test_an_override_the_grammar_refuses_is_one_line_saying_what_is_wrong(cfg, override, message):
    with pytest.raises(ConfigError) as raised:
        LazyConfig.apply_overrides(cfg, [override])
    assert str(raised.value).startswith(f"cannot parse override '{override}': {message}")
    assert "\n" not in str(raised.value)
