"""Configs written earlier, read in today's terms: a method's former name, and the keys added since a run
recorded its config.

A method renamed with ``@register(..., renamed_from=...)`` keeps its former name working (as ``algorithm:`` and
as its section's key) with one line on stderr naming the new one; a run's recorded config (``run.json``) is read
with every key added since at the value the run ran under, so that ``--resume`` continues it as it ran and a
comparison compares like with like.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

from fl_lightning.errors import UsageError

__all__ = ["current_names", "recorded_config", "added_key_overrides"]


def _renamed() -> dict[str, str]:
    from fl_lightning.algorithms import renamed_algorithms

    return renamed_algorithms()


def current_names(values: dict) -> dict:
    """``values`` (a config's mapping) with a method's former name replaced by its name now, both as
    ``algorithm:`` and as the section's key; one line on stderr says which name to use (see ``register``)."""
    renamed = _renamed()
    if not isinstance(values, dict) or not renamed:
        return values
    out = dict(values)
    old = out.get("algorithm")
    if isinstance(old, str) and old in renamed:
        _hint_renamed(old, renamed[old])
        out["algorithm"] = renamed[old]
    for key in [k for k in out if k in renamed]:
        new = renamed[key]
        _hint_renamed(key, new)
        if new in out:
            raise UsageError(
                f"config error: sections {key!r} and {new!r} both given; {key!r} is the former name of {new!r}: keep only {new!r}"
            )
        out[new] = out.pop(key)
    return out


@functools.cache  # once per name and process (a comparison builds every variant)
def _hint_renamed(old: str, new: str) -> None:
    print(
        f"fl_lightning: method {old!r} is now called {new!r}; the old name still works, but use {new!r} "
        f"(algorithm: {new}, section {new}:)",
        file=sys.stderr,
    )


# Keys added after runs were first recorded, with the value a run recorded without them ran under: such a
# recorded config (run.json) is read with that value — its numbers were made so — not with today's default.
_ADDED_KEYS: dict[str, dict[str, Any]] = {
    "federation": {
        "matmul_precision": "highest",
        "deterministic": False,  # torch's defaults, which ran then
        "privacy": {"mechanism": "off"},
    },  # no differential privacy before it existed
    # Hugging Face data sets, natural and Flower partitions: every earlier run ran with none of them;
    # the loader's settings and the uint8 cache: what every earlier run loaded with (speed only, resumable)
    "data": {
        "pin_memory": False,
        "persistent_workers": False,
        "normalize_on_device": False,
        "cache_uint8_mb": 0,
        "path": None,
        "train_split": "train",
        "test_split": "test",
        "image_column": None,
        "label_column": None,
        "revision": None,
    },
    "partition": {
        "by": None,
        "convention": "fl_lightning",
        "flower_shuffle_seed": None,
        "client_test_fraction": 0.0,
        "client_test_seed": None,
    },
    # the synthesis methods: pilots computed their own round 0 before round0_inputs existed, and pre-training read
    # the PNGs before pretrain_store (synthesis/store.py; its default, exact, reads the same items bit for bit).
    # A method's section is pinned only for a run that has it (added_key_overrides)
    **{section: {"round0_inputs": None, "pretrain_store": "off"} for section in ("fedisyn", "fgl", "gptfl")},
}


def recorded_config(values: dict) -> dict:
    """A config a run recorded (``run.json``), in today's terms: :func:`current_names`, and every key added since
    (:data:`_ADDED_KEYS`) with the value the run ran under, so that ``--resume`` continues it as it ran and a
    comparison compares like with like."""
    out = current_names(values)
    if not isinstance(out, dict):
        return out
    out = dict(out)
    for section, added in _ADDED_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {**added, **out[section]}  # what the run recorded wins
    return out


def added_key_overrides(recorded: dict) -> list[str]:
    """``--section.key value`` for every key added since (:data:`_ADDED_KEYS`), with the value the run ``recorded``
    (its ``run.json`` config, or its ``config.yaml`` for a folder from before records) ran with: the recorded
    value, or the key's value from before it existed. ``--resume`` loads the run's ``config.yaml`` with them, so
    a folder written before a key existed resumes as it ran, not under today's default."""
    out: list[str] = []
    for section, added in _ADDED_KEYS.items():
        present = recorded.get(section) if isinstance(recorded, dict) else None
        if not isinstance(present, dict):  # a method's section that this run has not (every core section it has)
            continue
        for key, before in added.items():
            value = present[key] if isinstance(present, dict) and key in present else before
            out += [f"--{section}.{key}", json.dumps(value)]
    return out
