"""Reading config trees without resolving them: the one module that touches OmegaConf's private node API.

Much of lazytrain looks at a config as written rather than as resolved: a saved config keeps ``${...}``
as text, validation reports a missing ``???`` instead of raising on it, `instantiate` follows an
interpolation to the very node it names so that node is built once. OmegaConf offers this only through
private methods (``_get_node``, ``_value``, ``_is_interpolation``, ...). They are wrapped here, and nowhere
else, so an OmegaConf upgrade that changes them touches this file alone.

Terms used below:

- a *node* is what a container holds for a key, unresolved: a `DictConfig`/`ListConfig`, or a leaf
  node holding a scalar. Getting it never runs an interpolation or a resolver.
- the *raw value* of a leaf is what the config file says: an interpolation stays its ``"${...}"`` text, a
  mandatory value its ``"???"``.
- a container node can itself be None, ``???`` or an interpolation (``DictConfig(None)``, a list merged
  with ``???``); it then has no children, and `walk` meets it without going into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeAlias

from omegaconf import DictConfig, ListConfig, Node, OmegaConf

try:  # OmegaConf 2.4 stores a tuple assigned into a config as an immutable TupleConfig
    from omegaconf import TupleConfig
except ImportError:  # OmegaConf 2.3 stores it as a ListConfig
    TupleConfig = None

__all__ = [
    "Container",
    "Entry",
    "JoinPath",
    "child",
    "children",
    "dereference",
    "dotted_path",
    "full_key",
    "has_children",
    "indexed_path",
    "is_interpolation",
    "is_missing",
    "is_none",
    "nodes",
    "points_at_container",
    "raw_target",
    "raw_value",
    "tuples_to_lists",
    "walk",
]

Container: TypeAlias = DictConfig | ListConfig
# How `walk` builds a child's key path: (the parent's path, the parent, the child's key) -> the child's path.
JoinPath: TypeAlias = Callable[[str, Container, Any], str]


class Entry(NamedTuple):
    """One child met by `walk`: where it is and the node itself (unresolved)."""

    path: str  # its key path from the walk's start, e.g. "model.heads[0].name"
    parent_path: str  # its parent's key path ("" for a child of the start)
    parent: Container  # assign ``parent[key] = ...`` to replace it
    key: Any  # str for a DictConfig child, int for a ListConfig child
    node: Node


def indexed_path(path: str, parent: Container, key: Any) -> str:
    """``a.b[2].c``: list indices in brackets, as OmegaConf writes full keys and as error messages cite them."""
    if isinstance(parent, ListConfig):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def dotted_path(path: str, parent: Container, key: Any) -> str:
    """``a.b.2.c``: every key after a dot, as command-line overrides name a key."""
    return f"{path}.{key}" if path else str(key)


def has_children(node: Any) -> bool:
    """A DictConfig/ListConfig that holds children: not None, ``???`` or an interpolation."""
    return isinstance(node, (DictConfig, ListConfig)) and not (
        node._is_none() or node._is_missing() or node._is_interpolation()
    )


def child(parent: Container, key: Any) -> Node | None:
    """The node `parent` holds for `key`, unresolved (an interpolation is not followed, ``???`` is no error);
    None when a DictConfig has no such key.

    Raises:
        omegaconf.errors.ConfigIndexError (an IndexError): a ListConfig index out of range.
    """
    return parent._get_node(key)


def children(node: Any) -> Iterator[tuple[Any, Node]]:
    """(key, child node) for every child of `node`, in order; nothing for a leaf.

    The keys are listed before the first child is yielded, so the caller may replace children as it goes.
    """
    if not has_children(node):
        return
    keys = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    for key in keys:
        yield key, child(node, key)


def walk(node: Any, path: str = "", *, join: JoinPath = indexed_path) -> Iterator[Entry]:
    """Every node under `node` (not `node` itself), depth first, each before its own children.

    Nothing is resolved: an interpolation is yielded as it is and not followed, so a node shared through
    ``${...}`` is met once, at its own place. The walk goes into a child only after the caller has seen it,
    and goes into the node it yielded, so replacing a leaf (``entry.parent[entry.key] = ...``) is safe.

    Args:
        node: where to start; a leaf yields nothing.
        path: the key path of `node`, prefixed to every path yielded.
        join: how key paths are written: `indexed_path` (``a.b[2].c``) or `dotted_path` (``a.b.2.c``).
    """
    for key, node_child in children(node):
        child_path = join(path, node, key)
        yield Entry(child_path, path, node, key, node_child)
        yield from walk(node_child, child_path, join=join)


def nodes(node: Any, path: str = "", *, join: JoinPath = indexed_path) -> Iterator[tuple[str, Any]]:
    """(key path, node) for `node` itself and then for everything `walk` meets under it."""
    yield path, node
    for entry in walk(node, path, join=join):
        yield entry.path, entry.node


def raw_value(node: Any) -> Any:
    """What `node` holds as written: ``"${...}"`` for an interpolation, ``"???"`` when missing, else the
    value; a container with children is returned as the node itself, and a non-node value unchanged."""
    if has_children(node) or not isinstance(node, Node):
        return node
    return node._value()


def is_interpolation(node: Any) -> bool:
    """`node` holds a ``${...}`` interpolation (a reference or a resolver call)."""
    return isinstance(node, Node) and node._is_interpolation()


def is_missing(node: Any) -> bool:
    """`node` holds the mandatory-value marker ``???`` itself (an interpolation to a ``???`` is not)."""
    return isinstance(node, Node) and node._is_missing()


def is_none(node: Any) -> bool:
    """`node` holds None itself (a container set to None included; an interpolation to None is not)."""
    return isinstance(node, Node) and node._is_none()


def dereference(node: Node) -> Node:
    """The node an interpolation refers to: the tree's own node for a reference (``${a.b}``, ``${..x}``),
    a new node holding the result for a resolver call. `node` itself when it is not an interpolation.

    Raises:
        omegaconf.errors.InterpolationResolutionError (or a subclass): the interpolation does not resolve.
    """
    return node._dereference_node()


def points_at_container(node: Any) -> bool:
    """`node` is an interpolation of a whole DictConfig/ListConfig (``dataset_dicts: ${..dataset}``).

    Raises:
        omegaconf.errors.InterpolationResolutionError (or a subclass): the interpolation does not resolve.
    """
    return is_interpolation(node) and isinstance(dereference(node), (DictConfig, ListConfig))


def full_key(node: Node) -> str:
    """The key path of `node` from the root of its config (``a.b[0].c``); "" for the root itself.

    Written by OmegaConf, quirk included: a container that is a list item loses its brackets (``a.b0``).
    Error messages have always quoted it so; a fix belongs here, for every caller at once.
    """
    key = node._get_full_key(None)
    return "" if key is None else str(key)


def raw_target(node: Any) -> Any:
    """The ``_target_`` of a DictConfig as written (`raw_value`): a dotted path, an interpolation's
    ``"${...}"`` text, or a DictConfig for a lazy target; None when `node` has no ``_target_``, is not a
    DictConfig, or is a DictConfig set to None, ``???`` or an interpolation."""
    # has_children first: `in` on a DictConfig holding None raises TypeError.
    if not (isinstance(node, DictConfig) and has_children(node)) or "_target_" not in node:
        return None
    return raw_value(child(node, "_target_"))


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_lists(item) for key, item in value.items()}
    return value


def tuples_to_lists(cfg: DictConfig) -> DictConfig:
    """`cfg` itself when it holds no TupleConfig, else a copy in which every tuple is a list (nested ones too;
    interpolations and ``???`` stay as written), as OmegaConf 2.3 stored a tuple.

    OmegaConf 2.4 stores a tuple assigned into a config (``model.pixel_std = (1.0, 1.0, 1.0)`` in a config
    file) as an immutable TupleConfig, which `walk` does not go into, an override cannot index and
    `LazyConfig.save` cannot write; the key keeps a tuple type, so assigning a list there converts it back:
    hence a new config.
    """
    if TupleConfig is None or not any(isinstance(entry.node, TupleConfig) for entry in walk(cfg)):
        return cfg
    return OmegaConf.create(_as_lists(OmegaConf.to_container(cfg, resolve=False)))
