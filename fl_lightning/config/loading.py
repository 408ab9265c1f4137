"""The strict loader: a plain mapping (a YAML file plus overrides) to a validated :class:`~fl_lightning.config.RunConfig`,
and back.

The method named by ``algorithm`` is looked up in the registry (``fl_lightning.algorithms``, imported on first
use so that importing the config stays cheap); its section is built with the method's own ``config_class``.
Imports point one way: this module reads the registry; the registry and the methods never import it at run time
(a method's config checks use :func:`fl_lightning.errors.check`).

Why our own loader rather than jsonargparse/LightningCLI: we need (a) ONE line per error naming the
dotted key, the value and what is allowed (jsonargparse prints a multi-line usage block), (b) a
did-you-mean for unknown keys, and (c) strict types (an int for a float is fine, a string is not)
with no coercion surprises. The mechanism is plain ``dataclasses`` + ``typing`` introspection, and
the YAML files stay the shape LightningCLI users know.

Example:
    >>> cfg = load_config("conf/quickstart.yaml", ["--partition.alpha", "0.01"])
    >>> cfg.partition.alpha, cfg.method.mu
    (0.01, 0.1)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from fl_lightning.config.history import current_names
from fl_lightning.config.schema import CORE_SECTIONS, RunConfig
from fl_lightning.config.yaml_io import merge, parse_overrides, read_config
from fl_lightning.errors import ConfigError, UsageError, did_you_mean

__all__ = ["load_config", "build_config", "schema_keys", "switch_algorithm", "config_to_dict", "dump_config"]


def _registry() -> dict[str, type]:
    """The registered methods (discovery imports them here, on first use: ``import fl_lightning.config`` stays
    cheap, and the registry never imports the config). A method named like a core key is refused here, where
    the core keys are known."""
    from fl_lightning.algorithms import available_algorithms, renamed_algorithms

    registry = available_algorithms()
    reserved = {*CORE_SECTIONS, *(f.name for f in dataclasses.fields(RunConfig))}
    clash = sorted(reserved & {*registry, *renamed_algorithms()})
    if clash:
        raise ValueError(
            f"cannot register a method named {clash[0]!r}: a method name is not one of the core keys {sorted(reserved)}"
        )
    return registry


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", dict: "a mapping", list: "a list"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


_REFUSED = object()  # what a plain type's check returns for a value it does not take


def _as_float(value: Any) -> Any:
    """A float from an int, a float or a string that reads as one (YAML 1.1 reads 1e-6, no dot, as a string;
    "inf" for IID; a leading dot of ".inf" is dropped); a bool is not a number."""
    if isinstance(value, str):
        try:
            return float(value.strip().lstrip("."))
        except ValueError:
            return _REFUSED
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return _REFUSED


# the plain annotations: each its check, the value as loaded (ints widened to float, a tuple as a list) or _REFUSED
_PLAIN: dict[Any, Callable[[Any], Any]] = {
    float: _as_float,
    int: lambda v: v if isinstance(v, int) and not isinstance(v, bool) else _REFUSED,
    bool: lambda v: v if isinstance(v, bool) else _REFUSED,
    str: lambda v: v if isinstance(v, str) else _REFUSED,
    dict: lambda v: v if isinstance(v, dict) else _REFUSED,
    list: lambda v: list(v) if isinstance(v, (list, tuple)) else _REFUSED,
}


def _literal(tp: Any, value: Any, key: str) -> Any:
    """``value`` if it is one of the Literal's choices; else one line listing them, with a did-you-mean."""
    choices = typing.get_args(tp)
    if value in choices:
        return value
    hint = did_you_mean(str(value), [str(c) for c in choices])
    raise ConfigError(key, value, f"one of {', '.join(repr(c) for c in choices)}{hint}")


def _union(tp: Any, value: Any, key: str) -> Any:
    """``value`` as the first member of the Union that takes it (None for an Optional's null)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value, key)
        except ConfigError:
            continue
    raise ConfigError(key, value, _type_name(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _literal(tp, value, key)
    if origin in (Union, types.UnionType):
        return _union(tp, value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    check = _PLAIN.get(tp)
    loaded = check(value) if check is not None else _REFUSED
    if loaded is _REFUSED:
        raise ConfigError(key, value, _type_name(tp))
    return loaded


def _loaded_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("loader") != "method"]


def _build(cls: type, values: Any, prefix: str, known: list[str] | None = None) -> Any:
    """Build dataclass ``cls`` from ``values`` strictly; ``known``: every dotted key, for did-you-mean."""
    if not isinstance(values, dict):
        chooser = next((f.name for f in dataclasses.fields(cls) if f.name in ("name", "mechanism", "kind")), None)
        hint = f" (did you mean {prefix}.{chooser}={values}?)" if chooser and isinstance(values, str) and prefix else ""
        raise ConfigError(prefix or "<root>", values, f"a mapping of keys to values{hint}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in _loaded_fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            local = [f"{prefix}.{n}" if prefix else n for n in names]
            hint = did_you_mean(dotted, local + (known or []))
            allowed = f"one of {', '.join(names)}" if len(names) <= 12 or not prefix else f"a key of the '{prefix}' section"
            if not prefix:
                allowed += " and the section of the selected algorithm"
            raise UsageError(f"config error: unknown key {dotted!r}{hint}; allowed here: {allowed}")
        kwargs[key] = _convert(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as err:  # __post_init__ checks know only their own key: add the section
        raise ConfigError(f"{prefix}.{err.key}" if prefix else err.key, err.value, err.allowed) from None


def _keys_of(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in _loaded_fields(cls):
        dotted = f"{prefix}{f.name}"
        tp = hints[f.name]
        keys += _keys_of(tp, dotted + ".") if dataclasses.is_dataclass(tp) else [dotted]
    return keys


def schema_keys(algorithm: str | None = None) -> list[str]:
    """Every dotted key a config can hold: the core keys, plus the sections of ``algorithm`` (or of every
    registered method when None)."""
    registry = _registry()
    keys = _keys_of(RunConfig)
    for name in [algorithm] if algorithm else sorted(registry):
        keys += _keys_of(registry[name].config_class, name + ".")
    return keys


def build_config(values: dict) -> RunConfig:
    """Build a validated :class:`RunConfig` from a plain mapping (the YAML's shape).

    The method named by ``algorithm`` is looked up in the registry; its section (same name) is built
    with the method's own ``config_class``. A section of another registered method is an error.
    """
    if not isinstance(values, dict):
        raise UsageError(f"config error: a config is a mapping of sections (data:, partition:, …), got {type(values).__name__}")
    registry = _registry()
    values = current_names(values)
    algorithm = values.get("algorithm", RunConfig.algorithm)
    if algorithm not in registry:
        from fl_lightning.algorithms import import_errors
        from fl_lightning.federation.policies.order import policy_setting_of

        names = sorted(registry)
        broken = "; ".join(f"{m} failed to import ({e})" for m, e in import_errors().items() if algorithm in m)
        setting = policy_setting_of(str(algorithm))
        hint = (
            f"; {algorithm!r} is not a method but an update policy: set {setting} beside a method (docs/policies.md)"
            if setting
            else did_you_mean(str(algorithm), names)
        )
        raise ConfigError(
            "algorithm", algorithm, f"one of {', '.join(repr(n) for n in names)}{hint}{f' — {broken}' if broken else ''}"
        )
    core = {k: v for k, v in values.items() if k != algorithm}
    for key in core:
        if key in registry:
            raise UsageError(
                f"config error: {key}: section given but algorithm is {algorithm} (a section belongs "
                f"to its method: remove it, or set algorithm: {key}; in a comparison, put it inside "
                f"the variant that selects {key})"
            )
    config_class = registry[algorithm].config_class
    known = schema_keys(algorithm)
    cfg = _build(RunConfig, core, "", known)
    cfg.method = _build(config_class, values.get(algorithm) or {}, algorithm, known)
    return cfg


def check_core_sections(values: dict) -> None:
    """The core sections of ``values`` (data, partition, …) checked with the schema alone, before the registry imports
    the methods: a mistake in them is the same one line as :func:`build_config`'s, seconds sooner. The method's own
    section, ``algorithm`` and the keys across sections are :func:`build_config`'s."""
    if not isinstance(values, dict):
        return
    hints = typing.get_type_hints(RunConfig)
    for name in CORE_SECTIONS:
        if name in values:
            _convert(hints[name], values[name], name)  # as build_config's RunConfig builds each section


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Build a validated :class:`RunConfig` from a YAML file plus ``--dotted.key value`` overrides.

    Raises:
        UsageError / ConfigError: one line naming the key, the value and what is allowed.
    """
    values, extra = read_config(path) if path is not None else {}, parse_overrides(overrides or [])
    check_core_sections(merge(values, extra))  # seconds before the methods' imports (a former name needs them)
    values, extra = current_names(values), current_names(extra)
    if "algorithm" in extra:  # --algorithm X on a file written for another method: as a variant would switch
        values = switch_algorithm(values, extra["algorithm"])
    return build_config(merge(values, extra))


def switch_algorithm(values: dict, algorithm: Any) -> dict:
    """``values`` with its method section made fit for ``algorithm``: the section of the method it names is
    dropped, except the keys both configs share when one method extends the other (see ``_carried_section``)."""
    old = values.get("algorithm", RunConfig.algorithm)
    registry = _registry()
    if algorithm == old or algorithm not in registry or old not in registry:
        return values
    values = dict(values)
    section = values.pop(old, None) or {}
    carried = _carried_section(section, registry[old].config_class, registry[algorithm].config_class)
    values[algorithm] = merge(carried, values.get(algorithm) or {})
    return {**values, "algorithm": algorithm}


def _carried_section(section: dict, old: type, new: type) -> dict:
    """What of method ``old``'s section a variant that switches to ``new`` keeps: the keys both configs
    declare, when one method's config extends the other's (FedOPAL's extends AFL's) or both are composed of
    a common stage's (FeDiSyn's and SFLF's of LoRA fine-tuning); otherwise nothing.

    A key whose value is ``old``'s default, where ``new`` declares another default, is not carried: the
    section may be a resolved config (every default written out), and FedOPAL's ``restat: local`` must not
    become FedOPAL+'s (whose default is ``global``). Set such a key inside the variant.
    """
    if not _share_a_section(old, new):
        return {}
    old_defaults, new_defaults = _field_defaults(old), _field_defaults(new)
    keep = old_defaults.keys() & new_defaults.keys()
    return {k: v for k, v in section.items() if k in keep and not (v == old_defaults[k] and old_defaults[k] != new_defaults[k])}


def _share_a_section(a: type, b: type) -> bool:
    """Whether one config extends the other, or both extend a config with keys of its own (two methods
    composed of a common stage, e.g. FeDiSyn and SFLF of LoRA fine-tuning)."""
    return any(
        dataclasses.is_dataclass(base) and base.__dict__.get("__annotations__") and issubclass(b, base) for base in a.__mro__
    )


def _field_defaults(config_class: type) -> dict[str, Any]:
    """Each field's default value (built from its factory where it has one)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = dataclasses.MISSING
    return out


def config_to_dict(cfg: Any) -> dict:
    """A plain dict (inf kept as float) of a config: the core sections, then the method's own section."""
    if not isinstance(cfg, RunConfig):
        return dataclasses.asdict(cfg)
    out = {f.name: _plain(getattr(cfg, f.name)) for f in _loaded_fields(RunConfig)}
    if cfg.method is not None:
        out[cfg.algorithm] = dataclasses.asdict(cfg.method)
    return out


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML that :func:`load_config` reads back unchanged."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
