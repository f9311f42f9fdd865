"""The shipped configs, installed as the package ``lazytrain.conf`` (pyproject.toml).

``python -m lazytrain lazytrain://NAME`` runs ``NAME.py`` from any folder (``python -m lazytrain --help`` lists
them), and a config file anywhere builds on one with ``from lazytrain.conf.NAME import ...``. They are config
files, executed afresh by `LazyConfig.load` at each import (lazytrain/config/loading.py), not modules for
Python's own import.
"""
