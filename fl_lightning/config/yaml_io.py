"""A config's text as plain mappings: YAML files, ``--dotted.key value`` overrides, one mapping merged over another.

YAML is read strictly: a key given twice in one mapping is an error (not last-wins), and a document whose
aliases (``&a`` / ``*a``) expand to more than :data:`MAX_YAML_VALUES` values, or refer to themselves, is refused
before anything is built. Every failure is one line (:class:`~fl_lightning.errors.UsageError`). What the
mappings mean is :mod:`fl_lightning.config.loading`'s business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fl_lightning.errors import UsageError

__all__ = ["read_yaml", "read_config", "parse_overrides", "merge", "MAX_YAML_VALUES", "BASE_KEY"]

BASE_KEY = "base"  # a config file's top-level key naming the file it extends (relative to it)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error, not last-wins."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)

# A config has hundreds of values; YAML aliases (&a / *a) can make a few lines mean billions (the "billion
# laughs"), which every later step (merging, printing, comparing records) would walk. Counted on the
# composed node graph, where an alias is a reference: linear in the distinct nodes, before anything is built.
MAX_YAML_VALUES = 100_000


class _TooBig(Exception):
    def __init__(self, what: str) -> None:
        self.what = what


def _expanded_values(root: yaml.Node, limit: int = MAX_YAML_VALUES) -> int:
    """How many values ``root`` stands for with every alias expanded; raises :class:`_TooBig` beyond ``limit``
    or for an alias inside its own anchor (a recursive structure). Iterative: a deep document cannot
    exhaust the stack here."""

    def children(node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    total: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            started.discard(key)
            total[key] = 1 + sum(total[id(c)] for c in children(node))
            if total[key] > limit:
                raise _TooBig(f"more than {limit:,} values once its aliases (*name) are expanded")
            continue
        if key in total:
            continue
        if key in started:
            raise _TooBig("an alias (*name) inside the structure its anchor (&name) marks: a recursive structure")
        started.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in total)
    return total[id(root)]


def _load_yaml(text: str) -> Any:
    """``text`` as YAML (unique keys), refusing alias bombs and recursive aliases (:class:`_TooBig`)."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_values(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict:
    """A config file as a mapping; one line (UsageError) when it is missing, not YAML, or not a mapping."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"usage error: --config '{path}' is a directory; pass a YAML file (see conf/)")
    if not path.is_file():
        raise UsageError(f"usage error: config file '{path}' not found; pass --config with an existing YAML file (see conf/)")
    try:
        values = _load_yaml(path.read_text())
    except UnicodeDecodeError:
        raise UsageError(f"usage error: config file '{path}' is not a text (YAML) file") from None
    except _TooBig as err:
        raise UsageError(f"usage error: config file '{path}' holds {err.what}; write the values out") from None
    except RecursionError:
        raise UsageError(f"usage error: config file '{path}' is nested too deeply to be a config") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None)
        what = f": {problem}" if problem and "duplicate key" in str(problem) else ""
        raise UsageError(f"usage error: config file '{path}' is not valid YAML{where}{what}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UsageError(
            f"usage error: config file '{path}' holds a {type(values).__name__} at the top level; "
            f"expected a mapping of sections (data:, partition:, …)"
        )
    return values


def read_config(path: str | Path) -> dict:
    """A config file as a mapping, with the file it extends: ``base: other.yaml`` (a path relative to this file)
    reads that file first — itself maybe extending another — and merges this one over it (:func:`merge`: a section
    merges key by key, a list or a value replaces). So configs that differ in a few keys (a paper's table on four
    data sets) state the rest once. One line (:class:`UsageError`) for a base that is missing, not a string, or a
    circle of bases."""
    chain: list[Path] = []
    values: dict = {}
    path = Path(path)
    while True:
        if path.resolve() in chain:
            names = " → ".join(str(p) for p in [*chain, path.resolve()])
            raise UsageError(f"usage error: config file '{path}' extends itself through {BASE_KEY}: ({names})")
        chain.append(path.resolve())
        layer = read_yaml(path)
        base = layer.pop(BASE_KEY, None)
        values = merge(layer, values)
        if base is None:
            return values
        if not isinstance(base, str) or not base:
            raise UsageError(
                f"usage error: config file '{path}': {BASE_KEY}: {base!r} is not allowed; expected the path "
                f"of the config file it extends, relative to it"
            )
        following = path.parent / base
        if not following.is_file():
            raise UsageError(f"usage error: config file '{path}': {BASE_KEY}: '{base}' not found (looked for '{following}')")
        path = following


def parse_overrides(overrides: list[str]) -> dict:
    """``["--a.b", "1", "--c=x"]`` → ``{"a": {"b": 1}, "c": "x"}`` (values parsed as YAML scalars)."""
    tree: dict = {}
    i = 0
    while i < len(overrides):
        token = overrides[i]
        if not token.startswith("--") or token == "--":
            raise UsageError(f"usage error: expected --key value, got {token!r}")
        key, sep, raw = token[2:].partition("=")
        if not sep:
            if i + 1 >= len(overrides):
                raise UsageError(f"usage error: --{key} needs a value")
            raw, i = overrides[i + 1], i + 1
        i += 1
        try:
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        except _TooBig as err:
            raise UsageError(f"usage error: --{key} holds {err.what}; write the values out") from None
        except RecursionError:
            raise UsageError(f"usage error: --{key} is nested too deeply to be a config value") from None
        if isinstance(value, dict) and not any(c.isspace() or c in "{}" for c in raw.strip()):
            value = raw  # "hf:" (a word and a colon) is that string on a command line, not the mapping {hf: null}
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"usage error: --{key} conflicts with another override")
        node[parts[-1]] = value
    return tree


def merge(base: dict, extra: dict) -> dict:
    """``extra`` over ``base``: a mapping in both merges key by key; anything else in ``extra`` replaces."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
