"""Round 0 shared by the runs of one output folder: the images and the pre-trained ViT under
``<output_dir>/round0/<key>/`` (the key: :func:`~fl_lightning.algorithms.synthetic_family.synthesis_step.round0_key`,
what they depend on), published by the first run that finished them and reused by later runs of the same key.

Each part (``generation``, ``pretraining``) is a folder with a ``record.json`` that names the key it was made for
and the SHA-256 of every file it holds. A part is reused only when its record is readable, names this key, and every
file is there with its recorded hash — and, for the ViT, when its checkpoint loads; otherwise (a folder of another
config moved under this key, an edited or truncated image, a poisoned checkpoint, a record from before the hashes)
one warning names the part and why, the part is removed and the run makes its own (and publishes it again). A
shared part is never reused unchecked, and a bad one never blocks its key. The check reads the part once (≈ 1.7 GiB/s
here; the images of 10,000 512-px PNGs, ≈ 4 GB, in ≈ 2.5 s, next to hours of generation).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["SharedRound0", "file_sha256"]

_CHUNK = 16 << 20  # bytes hashed at a time


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` but ``record.json``."""
    return {
        str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "record.json"
    }


class SharedRound0:
    """Round 0's images and pre-trained ViT under ``<root>/<key>/`` (module docstring); each run's folder keeps its
    own copies (hard links where the file system allows), so a run folder stays whole when the shared one goes.

    Publishing is a rename of a finished folder: a run never reads a half-written one, and two runs that finish
    the same key at once both keep their own results (the second's publication is dropped).

    Args:
        root: the shared folder (``<output_dir>/round0``).
        key: the content key of this round 0.
    """

    def __init__(self, root: Path, key: str) -> None:
        self.folder = Path(root) / key
        self.key = key

    def recorded(self, part: str) -> dict[str, Any]:
        return json.loads((self.folder / part / "record.json").read_text(encoding="utf-8"))

    def _unusable(self, part: str) -> str | None:
        """Why ``part`` cannot be reused (None: it holds what its record says, for this key)."""
        try:
            record = self.recorded(part)
            files = dict(record["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return "its record.json is unreadable or names no file hashes (published before they were recorded)"
        if record.get("key") != self.key:
            return f"its record names the key {record.get('key')!r}: another configuration's round 0"
        held = _files(self.folder / part)
        missing = sorted(set(files) - set(held))
        if missing:
            return f"'{missing[0]}' is missing ({len(missing)} file(s))"
        changed = sorted(f for f in files if held[f] != files[f])
        if changed:
            return f"'{changed[0]}' is not the file it published ({len(changed)} file(s) differ)"
        return None

    def _checked(self, part: str) -> bool:
        """Whether ``part`` is published and fit for reuse; an unfit one is removed with one warning."""
        if not (self.folder / part / "record.json").is_file():
            return False
        why = self._unusable(part)
        if why is None:
            return True
        self._reject(part, why)
        return False

    def _reject(self, part: str, why: str) -> None:
        warnings.warn(f"the shared round 0 '{self.folder / part}' is not reused and is made again: {why}", stacklevel=3)
        shutil.rmtree(self.folder / part, ignore_errors=True)

    def images_into(self, folder: Path) -> bool:
        """The published images linked into ``folder`` (True), or nothing fit for reuse published (False)."""
        if not self._checked("generation"):
            return False
        _link_tree(self.folder / "generation" / "images", folder)
        return True

    def publish_images(self, folder: Path, host_s: float) -> None:
        self._publish("generation", {"host_s": host_s}, lambda tmp: _link_tree(folder, tmp / "images"))

    def pretrained_into(self, out: Path) -> tuple[nn.Module, float, Path, float] | None:
        """The published ViT's checkpoint linked into ``out/checkpoints`` with its recorded times, or None."""
        from fl_lightning.modules.pretraining import load_pretrained_vit

        if not self._checked("pretraining"):
            return None
        source = self.folder / "pretraining"
        record = self.recorded("pretraining")
        try:
            model = load_pretrained_vit(source / "checkpoints" / record["best"], map_location="cpu")
        except Exception as err:  # noqa: BLE001 — any checkpoint that does not load is remade, never trusted
            self._reject(
                "pretraining",
                f"its checkpoint does not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
            )
            return None
        best = out / "checkpoints" / record["best"]
        _link_tree(source / "checkpoints", out / "checkpoints")
        return model, record["pretraining_s"], best, record["host_s"]

    def publish_pretraining(self, best: Path, pretraining_s: float, host_s: float) -> None:
        def fill(tmp: Path) -> None:
            (tmp / "checkpoints").mkdir(parents=True)
            _link(Path(best), tmp / "checkpoints" / Path(best).name)

        self._publish("pretraining", {"best": Path(best).name, "pretraining_s": pretraining_s, "host_s": host_s}, fill)

    def _publish(self, part: str, record: dict[str, Any], fill: Any) -> None:
        final = self.folder / part
        if (final / "record.json").is_file():
            return
        tmp = self.folder / f".{part}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        fill(tmp)
        record = {**record, "key": self.key, "files": _files(tmp)}
        (tmp / "record.json").write_text(json.dumps(record), encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:  # another run published the same key first: its files are the same
            shutil.rmtree(tmp, ignore_errors=True)


def _link(source: Path, target: Path) -> None:
    """``target`` as a hard link of ``source`` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _link_tree(source: Path, target: Path) -> None:
    """Every file under ``source`` linked at the same place under ``target`` (existing files kept)."""
    for path in sorted(Path(source).rglob("*")):
        if path.is_file():
            _link(path, Path(target) / path.relative_to(source))
