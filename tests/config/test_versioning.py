import pytest
from omegaconf import OmegaConf

from lazytrain.config import L, LazyConfig, instantiate, versioning
from tests.config import helpers

OLD_SAMPLER_FILE = (
    "# lazytrain-config-version: 0\n"
    "dataloader:\n  train:\n    sampler:\n      _target_: tests.config.helpers.Sampler\n"
    "      dataset_dicts: []\n      threshold: 0.001\n"
)


def test_saved_configs_carry_the_current_version(tmp_path):
    path = tmp_path / "c.yaml"
    LazyConfig.save(OmegaConf.create({"a": 1}), str(path))
    assert path.read_text().splitlines()[0] == f"# lazytrain-config-version: {versioning.CONFIG_VERSION}"
    assert versioning.read_version(path.read_text()) == versioning.CONFIG_VERSION
    assert LazyConfig.load(str(path)) == {"a": 1}  # the version is a comment, never a config key


def test_old_key_is_renamed_with_warning_and_instantiates(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_SAMPLER_FILE)
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        cfg = LazyConfig.load(str(path))
    assert cfg.dataloader.train.sampler.repeat_thresh == 0.001
    assert "threshold" not in cfg.dataloader.train.sampler
    assert (
        "'dataloader.train.sampler.threshold' was renamed to 'dataloader.train.sampler.repeat_thresh'"
        in caplog.text
    )
    assert instantiate(cfg.dataloader.train.sampler).repeat_thresh == 0.001


def test_current_version_file_is_not_rewritten(tmp_path, caplog):
    path = tmp_path / "new.yaml"
    path.write_text(
        "# lazytrain-config-version: 1\ndataloader:\n  train:\n    sampler:\n      threshold: 3\n"
    )
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        assert LazyConfig.load(str(path)).dataloader.train.sampler.threshold == 3
    assert caplog.text == ""


def test_renamed_interpolation_stays_an_interpolation(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_SAMPLER_FILE.replace("threshold: 0.001", "threshold: ${thresh}") + "thresh: 0.5\n")
    cfg = LazyConfig.load(str(path))
    assert OmegaConf.is_interpolation(cfg.dataloader.train.sampler, "repeat_thresh")
    assert cfg.dataloader.train.sampler.repeat_thresh == 0.5


def test_renames_chain_in_version_order(monkeypatch, caplog):
    monkeypatch.setattr(versioning, "CONFIG_VERSION", 3)
    monkeypatch.setattr(versioning, "RENAMES", [(3, "b.y", "c.z"), (2, "a.x", "b.y")])
    cfg = OmegaConf.create({"a": {"x": 1}})
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        versioning.upgrade_config(cfg, 1)
    assert OmegaConf.to_container(cfg) == {"a": {}, "b": {}, "c": {"z": 1}}
    assert caplog.text.count("was renamed") == 2


def test_new_key_already_set_wins(caplog):
    cfg = OmegaConf.create({"dataloader": {"train": {"sampler": {"threshold": 1, "repeat_thresh": 2}}}})
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        versioning.upgrade_config(cfg, 0, source="x.yaml")
    assert OmegaConf.to_container(cfg.dataloader.train.sampler) == {"repeat_thresh": 2}
    assert "x.yaml: key 'dataloader.train.sampler.threshold' was renamed" in caplog.text


def test_newer_version_warns(caplog):
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        versioning.upgrade_config(OmegaConf.create({}), versioning.CONFIG_VERSION + 1, source="f.yaml")
    assert "f.yaml was saved by a newer lazytrain" in caplog.text


@pytest.mark.parametrize(
    "text, version",
    [
        pytest.param("# lazytrain-config-version: 0\na: 1\n", 0, id="old"),
        pytest.param("a: 1\n", versioning.CONFIG_VERSION, id="no-header-is-current"),
        pytest.param("#  lazytrain-config-version:7 \n", 7, id="spacing"),
    ],
)
def test_read_version(text, version):
    assert versioning.read_version(text) == version


def test_lazycall_in_renamed_subtree_round_trips(tmp_path):
    cfg = OmegaConf.create({"dataloader": {"train": {"sampler": L(helpers.Sampler)(dataset_dicts=[1])}}})
    LazyConfig.save(cfg, str(tmp_path / "c.yaml"))
    assert LazyConfig.load(str(tmp_path / "c.yaml")) == cfg


COPY_PASTE_FILE = (
    "# lazytrain-config-version: {version}\n"
    "dataloader:\n  train:\n    mapper:\n      copy_paste:\n"
    "        _target_: lazytrain.data.copy_paste.CopyPaste\n        mode: rare\n{setting}"
)


def test_a_saved_config_setting_an_argument_whose_meaning_changed_is_told_in_one_line(tmp_path, caplog):
    """CopyPaste's min_area (8d6bd6e): the same key and value, another effect; the value is kept, not moved.
    Silent where the file leaves it at its default or was saved under the new meaning (after a save)."""
    path = tmp_path / "config.yaml"
    path.write_text(COPY_PASTE_FILE.format(version=1, setting="        min_area: 16\n"))
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        cfg = LazyConfig.load(str(path))
    assert cfg.dataloader.train.mapper.copy_paste.min_area == 16
    (record,) = caplog.records
    assert record.getMessage() == (
        f"{path} was saved by config version 1: 'dataloader.train.mapper.copy_paste.min_area' (16) changed "
        "meaning in config version 2: it now leaves out pasted objects with fewer pixels on the image, where it "
        "dropped the image's own instances left with fewer visible pixels (those now stay unless fully covered; "
        "1, the default, pastes every object that shows). Check the value, then save the config again to "
        "silence this warning."
    )
    caplog.clear()
    LazyConfig.save(cfg, str(path))
    (tmp_path / "default.yaml").write_text(COPY_PASTE_FILE.format(version=1, setting=""))
    with caplog.at_level("WARNING", logger="lazytrain.config.versioning"):
        LazyConfig.load(str(path))
        LazyConfig.load(str(tmp_path / "default.yaml"))
    assert caplog.text == ""
