"""The recipes the shipped configs are made of, installed as the package ``lazytrain.recipes`` (pyproject.toml).

A config file anywhere imports them by that name, e.g. ``from lazytrain.recipes.models.mask_rcnn_fpn import
model``; each import executes the file afresh (lazytrain/config/loading.py), so mutating what it gives never
leaks into another config.
"""
