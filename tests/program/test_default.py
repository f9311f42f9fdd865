"""The default training program's own steps (`lazytrain.program.default`) that need no run: what a resumed run
says about the config it started with."""

import logging

from omegaconf import OmegaConf

from lazytrain.config import LazyConfig
from lazytrain.program.default import _keep_config_of_resumed_run

COPY_PASTE = {"_target_": "lazytrain.data.copy_paste.CopyPaste", "mode": "rare", "min_area": 16}


def test_a_run_resumed_over_an_argument_whose_meaning_changed_says_so_and_keeps_the_earlier_config(
    tmp_path, caplog
):
    """Config version 1 with CopyPaste's min_area, resumed with the same values: the iterations already trained
    dropped small covered instances, the rest will not; the earlier config.yaml (version 1) is kept. Resumed
    again with the current version and the same values, it says nothing."""
    cfg = OmegaConf.create({"dataloader": {"train": {"mapper": {"copy_paste": COPY_PASTE}}}})
    path = tmp_path / "config.yaml"
    first = "# lazytrain-config-version: 1\n" + OmegaConf.to_yaml(cfg)
    path.write_text(first)
    with caplog.at_level(logging.WARNING, logger="lazytrain.program.default"):
        assert _keep_config_of_resumed_run(str(path), cfg)  # the program then saves the new config.yaml
    (record,) = caplog.records
    kept = tmp_path / "config.before_resume_1.yaml"
    assert record.getMessage() == (
        "train.resume: the iterations already trained ran under config version 1, and "
        "'dataloader.train.mapper.copy_paste.min_area' (16) changed meaning in config version 2: it now leaves out "
        "pasted objects with fewer pixels on the image, where it dropped the image's own instances left with fewer "
        "visible pixels (those now stay unless fully covered; 1, the default, pastes every object that shows). The "
        f"new meaning applies from the resumed iteration on; the earlier config is kept as {kept}."
    )
    assert kept.read_text() == first == path.read_text()  # replaced only by the save, atomically

    LazyConfig.save(cfg, str(path))  # resumed again: the config is current and the same
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lazytrain.program.default"):
        assert not _keep_config_of_resumed_run(str(path), cfg)
    assert caplog.text == "" and path.exists()
