"""Every config key, per method: the markdown table in docs/config_keys.md, generated from the dataclasses.

The core sections come first (every method has them), then one table per registered method: each key of its
own section with its type, its default (what ``--print-config`` shows when the key is not set), the class that
declares it — a key a method inherits from another method's config (FedOPAL's from AFL's) or from a stage's
(FeDiSyn's from LoRA fine-tuning's) names that class, so the composition is visible — and the comment the
dataclass source gives it. A nested section (``fedisyn.lora``) is flattened to dotted keys.

Example (``tests/test_config_keys.py`` checks that the committed page is this output)::

    python scripts/config_keys.py > docs/config_keys.md
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from fl_lightning.algorithms import available_algorithms
from fl_lightning.config import RunConfig

__all__ = ["render", "shipped_algorithms"]

REPO = Path(__file__).resolve().parents[1]
_TYPE_IGNORE = re.compile(r"^(type: ignore(\[[^\]]*\])?|noqa(: [A-Z0-9, ]+)?)\s*(#\s*)?")


def _type_text(tp: Any) -> str:
    """An annotation as a reader writes it: ``int | None``, ``'sgd' | 'adamw'``, ``LoRAConfig``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_text(a) for a in typing.get_args(tp))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_text(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _value_text(value: Any) -> str:
    """A default as YAML would hold it (``null``, ``true``, ``inf``, ``[]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (list, tuple, dict)):
        return repr(list(value) if isinstance(value, tuple) else value)
    return str(value)


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in ``cls``'s own source: the comment lines right above it and the one after it."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    node = ast.parse(source).body[0]
    text = source.splitlines()
    out = {}
    for item in node.body if isinstance(node, ast.ClassDef) else []:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        above = []
        row = item.lineno - 2
        while row >= 0 and text[row].strip().startswith("#"):
            above.insert(0, text[row].strip()[1:].strip())
            row -= 1
        after = ""
        last = text[item.end_lineno - 1]
        code_end = len(ast.get_source_segment(source, item).splitlines()[-1])
        if item.lineno == item.end_lineno:
            code_end += item.col_offset
        tail = last[code_end:].strip()
        if tail.startswith("#"):
            after = _TYPE_IGNORE.sub("", tail[1:].strip()).strip()
        out[item.target.id] = " ".join(part for part in (*above, after) if part)
    return out


def _declared_in(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO that declares field ``name`` last (a subclass that redeclares it wins)."""
    return next(base for base in cls.__mro__ if name in base.__dict__.get("__annotations__", {}))


def _rows(cls: type, instance: Any, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(dotted key, type, default, declaring class, comment) of every loaded field, nested sections flattened."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("loader") == "method":
            continue
        tp, value, owner = hints[f.name], getattr(instance, f.name), _declared_in(cls, f.name)
        if dataclasses.is_dataclass(tp):
            rows += _rows(tp, value, f"{prefix}{f.name}.")
            continue
        rows.append((prefix + f.name, _type_text(tp), _value_text(value), owner.__name__, _described(cls, f.name)))
    return rows


def _described(cls: type, name: str) -> str:
    """What field ``name`` is: its comment where it is declared last; a redeclaration without one (a method that
    only changes a base's default) keeps the nearest base's comment; else the class docstring's ``Args:`` /
    ``Attributes:`` entry."""
    for base in cls.__mro__[cls.__mro__.index(_declared_in(cls, name)) :]:
        text = _comments(base).get(name) if dataclasses.is_dataclass(base) else None
        if text:
            return text
    for base in cls.__mro__:
        text = _docstring_args(base).get(name)
        if text:
            return text
    return ""


@functools.cache
def _docstring_args(cls: type) -> dict[str, str]:
    """``name: text`` entries of the Google-style ``Args:`` / ``Attributes:`` section of ``cls``'s own docstring."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    out: dict[str, str] = {}
    section, current = False, None
    for line in doc.splitlines():
        if re.fullmatch(r"(Args|Attributes|Arguments):", line.strip()):
            section, current = True, None
            continue
        if not section:
            continue
        entry = re.fullmatch(r"    (\w+)(?: \([^)]*\))?: (.*)", line)
        if entry:
            current = entry.group(1)
            out[current] = entry.group(2).strip()
        elif current and line.startswith("        "):
            out[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            section, current = False, None
    return out


def _cell(text: str, code: bool = False) -> str:
    """``text`` as a table cell: ``|`` escaped; outside code, ``<`` too (``<method>`` is no HTML tag)."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if code else text.replace("<", "&lt;")


def _table(rows: list[tuple[str, str, str, str, str]], key_prefix: str) -> list[str]:
    head = ["key", "type", "default", "declared in", "what it is"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, tp, default, owner, comment in rows:
        code = [key_prefix + key, tp, default, owner]
        out.append("| " + " | ".join([*(_cell(c, code=True) for c in code), _cell(comment)]) + " |")
    return out


def _where(cls: type) -> str:
    path = Path(inspect.getsourcefile(cls)).resolve()
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return path.name


def shipped_algorithms() -> dict[str, type]:
    """The registered methods this package ships (not a plug-in's, nor one a test file registers)."""
    return {name: cls for name, cls in available_algorithms().items() if cls.__module__.startswith("fl_lightning.")}


def render() -> str:
    """The whole page (markdown)."""
    out = [
        "# Config keys, per method",
        "",
        "<!-- generated by `python scripts/config_keys.py > docs/config_keys.md`; tests/test_config_keys.py keeps it current -->",
        "",
        "Every key a config can hold: the core sections every method shares, then each method's own section",
        "(the YAML section named like the method). *default* is the value a key takes when the config leaves",
        "it out (what `--print-config` shows); *declared in* names the dataclass that declares the key — a",
        "method's config extends another method's or a stage's, and inherits its keys. Types and comments",
        "are the dataclasses' own (`fl_lightning/config/schema.py`, each method's file); docs/usage.md says how",
        "configs are written and overridden.",
        "",
        "## Core sections (every method)",
        "",
    ]
    out += _table(_rows(RunConfig, RunConfig()), "")
    for name, algorithm in sorted(shipped_algorithms().items()):
        cls = algorithm.config_class
        bases = [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b) and b.__dict__.get("__annotations__")]
        composed = f"; extends {', '.join(f'`{b.__name__}`' for b in bases)}" if bases else ""
        out += ["", f"## `{name}`", "", f"Section `{name}:` — `{cls.__name__}` ({_where(cls)}){composed}.", ""]
        rows = _rows(cls, cls())
        out += _table(rows, f"{name}.") if rows else ["No keys of its own."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
