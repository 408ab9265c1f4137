"""Round 0's inputs handed to the pilots: the clients' uploads and the prompts, made once by the run that asked.

Each pilot of ``synthetic_lambda: auto`` is a whole run of the same config at a small λ (``pilots.py``): left
alone, it would encode every client's images again (the VAE over the whole training split at 512 px) and expand
the labels' prompts again (the LLM), the same work as its parent's round 0, with the same seeds. Instead the
parent writes what its round 0 received, before it starts the pilots::

    <run_dir>/pilots/round0_inputs/
        key.json             the content key of the config the uploads belong to (:func:`inputs_key`)
        client<k>.pt         client k's round-0 upload (tensors and meta, as it crossed the simulated network)
        prompts.json         the label → prompts cache of the parent (``synthesis_step``'s file)

and every pilot runs with ``<section>.round0_inputs`` naming that folder: its clients hand on their stored upload
instead of computing it (the same bytes cross the simulated channel, so the clock and the traffic are the pilot's
own), and its prompt cache starts from the parent's, so the LLM is never loaded. A client without a file (it
failed in the parent's round 0) computes its upload as before. The folder is read only when its key is the
pilot's own (:func:`inputs_key` drops only what a pilot changes: λ, the rounds, the ranks, where it writes);
any other folder is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_lightning.federation.checkpoint import atomic_save, safe_load
from fl_lightning.federation.transport import Upload

__all__ = ["inputs_key", "write_round0_inputs", "hand_prompts", "stored_upload", "seed_prompt_cache", "FOLDER"]

FOLDER = "round0_inputs"
_KEY_FILE, _PROMPTS = "key.json", "prompts.json"
# what a pilot changes in its parent's config (pilots.run_pilot_processes), and where it writes: not in the key
_PILOT_KEYS = ("synthetic_lambda", "round0_inputs")
_RUN_KEYS = ("output_dir", "run_name", "logging", "variants", "sweep", "label")
_FEDERATION_KEYS = ("rounds", "devices", "num_nodes")


def inputs_key(config: Mapping[str, Any], section: str) -> str:
    """sha256 of the run's config as a mapping (``dataclasses.asdict`` of the RunConfig, whose method section is
    ``section``) without what a pilot changes: ``<section>.synthetic_lambda`` and ``.round0_inputs``,
    ``federation.rounds`` / ``devices`` / ``num_nodes``, the output folder, run name, logging, variants, sweep and
    label. Everything else decides round 0's uploads and prompts."""
    kept = {k: v for k, v in config.items() if k not in _RUN_KEYS}
    kept["federation"] = {k: v for k, v in (kept.get("federation") or {}).items() if k not in _FEDERATION_KEYS}
    kept[section] = {k: v for k, v in (kept.get(section) or {}).items() if k not in _PILOT_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def write_round0_inputs(folder: Path, key: str, uploads: Mapping[int, Upload]) -> None:
    """The parent's side, before its prompts are made: ``key.json`` last, so a folder with a key holds every upload
    (a rerun rewrites it). :func:`hand_prompts` adds the prompt cache once it exists."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _KEY_FILE).unlink(missing_ok=True)
    for stale in folder.glob("client*.pt"):
        stale.unlink()
    for client, upload in uploads.items():
        atomic_save(upload.state_dict(), folder / f"client{int(client)}.pt", durable=False)
    (folder / _KEY_FILE).write_text(json.dumps({"key": key}))


def hand_prompts(folder: Path, prompts_cache: Path) -> bool:
    """Copy the parent's prompt cache into ``folder`` when it holds finished inputs; whether it does (the pilots
    then read it: ``pilots.run_pilot_processes``)."""
    if not (folder / _KEY_FILE).is_file():
        return False
    if prompts_cache.is_file():  # whole or not at all: the ranks of a run hand it at once, their pilots read it
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{_PROMPTS}.", suffix=".tmp")
        os.close(fd)
        shutil.copyfile(prompts_cache, tmp)
        os.replace(tmp, folder / _PROMPTS)
    return True


def _checked(folder: str | Path, key: str) -> Path:
    from fl_lightning.errors import UsageError

    folder = Path(folder)
    try:
        found = json.loads((folder / _KEY_FILE).read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found != key:
        why = "holds no finished key.json" if found is None else "was written for another config"
        raise UsageError(f"round0_inputs: '{folder}' {why}; it is written by a run with synthetic_lambda: auto for "
                         f"its own pilots (set round0_inputs to null to compute round 0 here)")
    return folder


def stored_upload(folder: str | Path, key: str, client: int) -> Upload | None:
    """Client ``client``'s upload from the parent's round 0, or None when it has none (it computes its own)."""
    path = _checked(folder, key) / f"client{int(client)}.pt"
    return Upload.from_state_dict(safe_load(path)) if path.is_file() else None


def seed_prompt_cache(folder: str | Path, key: str, cache: Path) -> None:
    """Start this run's prompt cache from the parent's (when it has none yet)."""
    source = _checked(folder, key) / _PROMPTS
    if source.is_file() and not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, cache)
