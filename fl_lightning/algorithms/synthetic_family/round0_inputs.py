"""Round 0's inputs handed to the pilots: the clients' uploads and the prompts, made once by the run that asked.

Each pilot of ``synthetic_lambda: auto`` is a whole run of the same config at a small λ (``pilots.py``): left
alone, it would encode every client's images again (the VAE over the whole training split at 512 px) and expand
the labels' prompts again (the LLM), the same work as its parent's round 0, with the same seeds. Instead the
parent writes what its round 0 received, before it starts the pilots::

    <run_dir>/pilots/round0_inputs/
        key.json             the content key of the config the uploads belong to (:func:`inputs_key`) and the
                             SHA-256 of every client file, checked before a pilot uses one
        client<k>.pt         client k's round-0 upload (tensors and meta, as it crossed the simulated network)
        prompts.json         the label → prompts cache of the parent (``synthesis_step``'s file)

and every pilot runs with ``<section>.round0_inputs`` naming that folder: its clients hand on their stored upload
instead of computing it (the same bytes cross the simulated channel, so the clock and the traffic are the pilot's
own), and its prompt cache starts from the parent's, so the LLM is never loaded. A client without a file (it
failed in the parent's round 0) computes its upload as before. The folder is read only when its key is the
pilot's own (:func:`inputs_key` drops only what a pilot changes: λ, the rounds, the ranks, where it writes);
any other folder is refused in one line, and so is a client file that is not the one the parent wrote (swapped,
edited, or not listed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_lightning.algorithms.synthetic_family.shared_round0 import file_sha256
from fl_lightning.durable_write import atomic_path, write_text_atomic
from fl_lightning.federation.storage.checkpoint import atomic_save, safe_load
from fl_lightning.federation.transport import Upload

__all__ = ["inputs_key", "write_round0_inputs", "hand_prompts", "stored_upload", "seed_prompt_cache", "FOLDER"]

FOLDER = "round0_inputs"
_KEY_FILE, _PROMPTS = "key.json", "prompts.json"
# what a pilot changes in its parent's config (pilots.run_pilot_processes), and where it writes: not in the key
_PILOT_KEYS = ("synthetic_lambda", "round0_inputs", "round0_dir")
_RUN_KEYS = ("output_dir", "run_name", "logging", "variants", "sweep", "label")
_FEDERATION_KEYS = ("rounds", "devices", "num_nodes")


def inputs_key(config: Mapping[str, Any], section: str) -> str:
    """sha256 of the run's config as a mapping (``dataclasses.asdict`` of the RunConfig, whose method section is
    ``section``) without what a pilot changes: ``<section>.synthetic_lambda``, ``.round0_inputs`` and ``.round0_dir``,
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
    files = {}
    for client, upload in uploads.items():
        path = folder / f"client{int(client)}.pt"
        atomic_save(upload.state_dict(), path, durable=False)
        files[path.name] = file_sha256(path)
    write_text_atomic(folder / _KEY_FILE, json.dumps({"key": key, "files": files}))


def hand_prompts(folder: Path, prompts_cache: Path) -> bool:
    """Copy the parent's prompt cache into ``folder`` when it holds finished inputs; whether it does (the pilots
    then read it: ``pilots.run_pilot_processes``)."""
    if not (folder / _KEY_FILE).is_file():
        return False
    if prompts_cache.is_file():  # whole or not at all: the ranks of a run hand it at once, their pilots read it
        with atomic_path(folder / _PROMPTS) as tmp:
            shutil.copyfile(prompts_cache, tmp)
    return True


def _record(folder: str | Path, key: str) -> tuple[Path, dict[str, str]]:
    """``folder`` and its client files' hashes, when ``key.json`` is finished and for ``key``; else one line."""
    from fl_lightning.errors import UsageError

    folder = Path(folder)
    try:
        record = json.loads((folder / _KEY_FILE).read_text())
        found, files = record["key"], dict(record["files"])
    except (OSError, ValueError, KeyError, TypeError):
        found, files = None, {}
    if found != key:
        why = "holds no finished key.json" if found is None else "was written for another config"
        raise UsageError(
            f"round0_inputs: '{folder}' {why}; it is written by a run with synthetic_lambda: auto for "
            f"its own pilots (set round0_inputs to null to compute round 0 here)"
        )
    return folder, files


def stored_upload(folder: str | Path, key: str, client: int) -> Upload | None:
    """Client ``client``'s upload from the parent's round 0, or None when it has none (it computes its own).

    Raises:
        UsageError: the client's file is not the one the parent wrote (its hash differs, or key.json lists none).
    """
    from fl_lightning.errors import UsageError

    folder, files = _record(folder, key)
    path = folder / f"client{int(client)}.pt"
    if not path.is_file():
        return None
    if files.get(path.name) != file_sha256(path):
        why = "is not listed in key.json" if path.name not in files else "is not the upload its parent wrote"
        raise UsageError(
            f"round0_inputs: '{path}' {why} (swapped or edited); rerun the parent, or set round0_inputs "
            f"to null to compute round 0 here"
        )
    return Upload.from_state_dict(safe_load(path))


def seed_prompt_cache(folder: str | Path, key: str, cache: Path) -> None:
    """Start this run's prompt cache from the parent's (when it has none yet)."""
    source = _record(folder, key)[0] / _PROMPTS
    if source.is_file() and not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, cache)
