"""`lazytrain.config.tree`: walking and reading config trees without resolving them."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from lazytrain.config import tree


def _cfg() -> DictConfig:
    return OmegaConf.create(
        {
            "model": {
                "_target_": "pkg.Model",
                "depth": 50,
                "heads": [{"name": "box"}, "${model.depth}"],
            },
            "data": {"train": "???", "val": "${data.train}", "shared": "${model}"},
            "lr": 0.1,
        }
    )


def test_walk_visits_every_node_depth_first_with_indexed_paths():
    assert [entry.path for entry in tree.walk(_cfg())] == [
        "model",
        "model._target_",
        "model.depth",
        "model.heads",
        "model.heads[0]",
        "model.heads[0].name",
        "model.heads[1]",
        "data",
        "data.train",
        "data.val",
        "data.shared",
        "lr",
    ]


def test_walk_dotted_paths_and_prefix():
    cfg = OmegaConf.create({"a": [{"b": 1}], "c": 2})
    assert [e.path for e in tree.walk(cfg, join=tree.dotted_path)] == ["a", "a.0", "a.0.b", "c"]
    assert [e.path for e in tree.walk(cfg.a, "a")] == ["a[0]", "a[0].b"]
    # A list at the root: indices in brackets from the start, as OmegaConf writes them.
    assert [e.path for e in tree.walk(OmegaConf.create([[7]]))] == ["[0]", "[0][0]"]


def test_walk_entries_name_their_parent_and_key():
    cfg = _cfg()
    entries = {entry.path: entry for entry in tree.walk(cfg)}
    head = entries["model.heads[1]"]
    assert head.parent is cfg.model.heads
    assert head.key == 1 and isinstance(head.key, int)
    assert head.parent_path == "model.heads"
    assert entries["model"].parent is cfg and entries["model"].parent_path == ""
    assert tree.raw_value(head.node) == "${model.depth}"


def test_walk_does_not_follow_interpolations():
    # data.shared points at the whole model node: the walk meets that node once, at its own place.
    paths = [entry.path for entry in tree.walk(_cfg())]
    assert not any(path.startswith("data.shared.") for path in paths)
    assert sum(path == "model.depth" or path.endswith(".depth") for path in paths) == 1


def test_walk_of_a_leaf_or_an_empty_container_yields_nothing():
    cfg = OmegaConf.create({"x": 1, "d": {}, "l": []})
    assert list(tree.walk(cfg.x)) == []
    assert list(tree.walk(cfg.d)) == []
    assert list(tree.walk(cfg.l)) == []


def test_walk_does_not_go_into_containers_that_are_none_missing_or_interpolations():
    cfg = OmegaConf.create({"a": {"x": 1}})
    cfg.none = DictConfig(content=None)
    cfg.missing = ListConfig(content="???")
    cfg.link = DictConfig(content="${a}")
    assert [e.path for e in tree.walk(cfg)] == ["a", "a.x", "none", "missing", "link"]
    assert not tree.has_children(cfg._get_node("link"))
    assert tree.has_children(cfg.a)


def test_walk_lets_the_caller_replace_leaves_as_it_goes():
    cfg = OmegaConf.create({"a": ["/out/x", {"b": "/out"}], "c": "/elsewhere"})
    for entry in tree.walk(cfg):
        value = tree.raw_value(entry.node)
        if isinstance(value, str) and value.startswith("/out"):
            entry.parent[entry.key] = "${dir}" + value[len("/out") :]
    assert OmegaConf.to_container(cfg) == {"a": ["${dir}/x", {"b": "${dir}"}], "c": "/elsewhere"}


def test_nodes_starts_with_the_node_itself():
    cfg = OmegaConf.create({"a": [1]})
    found = list(tree.nodes(cfg))
    assert [path for path, _ in found] == ["", "a", "a[0]"]
    assert found[0][1] is cfg and found[1][1] is cfg.a


def test_children_in_order_for_dicts_and_lists():
    cfg = OmegaConf.create({"b": 1, "a": ["x", "${b}"]})
    assert [key for key, _ in tree.children(cfg)] == ["b", "a"]
    assert [(key, tree.raw_value(node)) for key, node in tree.children(cfg.a)] == [(0, "x"), (1, "${b}")]
    assert list(tree.children(cfg._get_node("b"))) == []


def test_child_is_the_unresolved_node():
    cfg = OmegaConf.create({"a": {"x": 1}, "ref": "${a}", "l": [1]})
    assert tree.child(cfg, "a") is cfg.a
    assert tree.is_interpolation(tree.child(cfg, "ref"))
    assert tree.child(cfg, "absent") is None
    with pytest.raises(IndexError):
        tree.child(cfg.l, 3)


def test_raw_value_keeps_interpolations_and_missing_values_as_written():
    cfg = _cfg()
    assert tree.raw_value(tree.child(cfg.data, "val")) == "${data.train}"
    assert tree.raw_value(tree.child(cfg.data, "train")) == "???"
    assert tree.raw_value(tree.child(cfg.model.heads, 1)) == "${model.depth}"
    assert tree.raw_value(tree.child(cfg, "lr")) == 0.1
    assert tree.raw_value(tree.child(cfg, "model")) is cfg.model  # a container is the node itself
    assert tree.raw_value(OmegaConf.create({"n": None})._get_node("n")) is None
    assert tree.raw_value(3) == 3  # not a node: unchanged


def test_is_missing_is_interpolation_and_is_none_read_the_node_itself():
    cfg = OmegaConf.create({"m": "???", "to_m": "${m}", "n": None, "to_n": "${n}", "s": "text"})
    assert tree.is_missing(tree.child(cfg, "m"))
    assert not tree.is_missing(tree.child(cfg, "to_m"))  # an interpolation, even to a missing value
    assert tree.is_interpolation(tree.child(cfg, "to_m"))
    assert tree.is_none(tree.child(cfg, "n"))
    assert not tree.is_none(tree.child(cfg, "to_n"))
    assert not tree.is_interpolation(tree.child(cfg, "s"))
    assert not tree.is_missing(tree.child(cfg, "s"))
    assert tree.is_none(DictConfig(content=None))
    assert not tree.is_interpolation("${m}") and not tree.is_missing("???")  # plain strings are no nodes


def test_points_at_container_and_dereference():
    cfg = _cfg()
    shared = tree.child(cfg.data, "shared")
    assert tree.points_at_container(shared)
    assert tree.dereference(shared) is cfg.model  # the tree's own node, not a copy
    assert tree.dereference(cfg.model) is cfg.model  # not an interpolation: itself
    assert not tree.points_at_container(tree.child(cfg.model.heads, 1))  # ${model.depth}: a scalar
    assert not tree.points_at_container(tree.child(cfg.model, "heads"))  # a container, no interpolation
    assert tree.points_at_container(OmegaConf.create({"l": [1], "r": "${l}"})._get_node("r"))
    broken = OmegaConf.create({"r": "${nowhere}"})._get_node("r")
    with pytest.raises(InterpolationResolutionError):
        tree.points_at_container(broken)


def test_full_key_is_the_path_from_the_root():
    cfg = _cfg()
    assert tree.full_key(cfg) == ""
    assert tree.full_key(cfg.model) == "model"
    assert tree.full_key(tree.child(cfg.model.heads, 1)) == "model.heads[1]"
    assert tree.full_key(tree.child(cfg.model.heads[0], "name")) == "model.heads[0].name"


def test_raw_target_does_not_resolve():
    cfg = OmegaConf.create(
        {
            "plain": {"_target_": "pkg.f"},
            "ref": {"_target_": "${plain._target_}"},
            "lazy": {"_target_": {"_target_": "pkg.factory"}},
            "none": {"x": 1},
            "l": [1],
        }
    )
    assert tree.raw_target(cfg.plain) == "pkg.f"
    assert tree.raw_target(cfg.ref) == "${plain._target_}"
    assert tree.raw_target(cfg.lazy) is cfg.lazy._target_
    assert tree.raw_target(cfg.none) is None
    assert tree.raw_target(cfg.l) is None
    assert tree.raw_target(tree.child(cfg.plain, "_target_")) is None
    assert tree.raw_target(DictConfig(content=None)) is None
    assert tree.raw_target(DictConfig(content="${plain}")) is None
