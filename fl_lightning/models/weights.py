"""Where backbone weights come from, and whether a weights file can be used at all.

Two jobs, both without any network request:

* **Resolution** — a pretrained tag of open_clip or timm names files on the Hugging Face hub or at
  a URL. :func:`find_cached_weights` looks for them in the local caches (the Hugging Face cache
  layout, or a URL's basename in a folder) and, when they are absent, raises one
  :class:`~fl_lightning.errors.MissingResourceError` line saying what was looked for and how to
  provide it — instead of huggingface_hub's ~46 s of retries followed by a traceback.
* **Validation** — :func:`check_checkpoint` tells at once (it reads the safetensors header, or the
  torch archive through ``mmap``) whether a weights file is readable and holds a state dict, so a
  preflight can reject a text file, an empty or truncated file, a pickle with Python objects or a
  TorchScript archive before any model is built. Whether its keys fit the model is checked when
  the model is built (:func:`key_mismatch_message`). Files are only ever opened with
  ``weights_only=True`` or safetensors, and torch's own advice to pass ``weights_only=False`` never
  reaches the user.

Nothing here imports open_clip or timm: the adapters pass in what their libraries know.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fl_lightning.errors import MissingResourceError

__all__ = [
    "NO_WEIGHTS_HINT",
    "WEIGHTS_SUFFIXES",
    "check_checkpoint",
    "describe_load_error",
    "find_cached_weights",
    "hf_cache_dir",
    "hf_cached_file",
    "key_mismatch_message",
    "open_state_dict",
]

NO_WEIGHTS_HINT = (
    "set model.checkpoint: /path/to/weights.(pt|bin|safetensors) or a hub id (org/name), "
    "or model.download: true on a machine with internet"
)
WEIGHTS_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
_EXPECTED = (
    "expected a state dict saved with torch.save(model.state_dict(), path) (.pt, .pth, .bin) "
    "or safetensors.torch.save_file (.safetensors)"
)
# Wrappers the libraries unwrap before loading (timm: EMA first; open_clip: 'state_dict').
_NESTED_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")
_ZIP_MAGIC = b"PK\x03\x04"


# ------------------------------------------------------------------------------------------------
# Resolution in the local caches
# ------------------------------------------------------------------------------------------------
def hf_cache_dir(cache_dir: str | None) -> str:
    """The Hugging Face hub cache folder that a lookup with ``cache_dir`` searches (``models/hub.py``'s rule)."""
    from fl_lightning.models.hub import hub_cache_dir

    return hub_cache_dir(cache_dir)


def hf_cached_file(repo_id: str, filenames: Sequence[str], cache_dir: str | None) -> str | None:
    """Path of the first of ``filenames`` of ``repo_id`` in the local Hugging Face cache, or None.

    Makes no request (``try_to_load_from_cache`` reads ``refs/main`` and the snapshot folder only).
    """
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=hf_cache_dir(cache_dir))
        if isinstance(found, str) and os.path.isfile(found):
            return found
    return None


def find_cached_weights(
    *,
    what: str,
    file: str | None = None,
    hf_hub_id: str | None = None,
    hf_filenames: Sequence[str] = (),
    url: str | None = None,
    url_dir: str,
    cache_dir: str | None = None,
) -> str:
    """The local file of a pretrained tag, looked up in this order: ``file``, the Hugging Face cache,
    the basename of ``url`` in ``url_dir``.

    Args:
        what: the weights in words for the message (``"timm weights vit_base_patch16_224.augreg…"``).
        file: a path the library's config already names (returned as is).
        hf_hub_id, hf_filenames: the hub repository and the file names to try, best first.
        url, url_dir: a download URL and the folder the library would have saved it in.
        cache_dir: the Hugging Face cache to search (None: huggingface_hub's default).

    Raises:
        MissingResourceError: nothing on disk; one line naming every place looked at.
    """
    if file:
        return file
    looked: list[str] = []
    if hf_hub_id and hf_filenames:
        found = hf_cached_file(hf_hub_id, hf_filenames, cache_dir)
        if found:
            return found
        looked.append(f"hf://{hf_hub_id}/{hf_filenames[0]} in {hf_cache_dir(cache_dir)}")
    if url:
        target = os.path.join(url_dir, os.path.basename(url))
        if os.path.isfile(target):
            return target
        looked.append(target)
    fetch = f"run `hf download {hf_hub_id}` on a machine with internet (and copy the cache here), " if hf_hub_id else ""
    raise MissingResourceError(
        f"{what} are not on disk (looked for {' and '.join(looked) or 'a weights source'}; "
        f"downloading is off); {fetch}{NO_WEIGHTS_HINT}"
    )


# ------------------------------------------------------------------------------------------------
# Validation of a weights file
# ------------------------------------------------------------------------------------------------
def _bad(label: str, path: str, problem: str) -> MissingResourceError:
    return MissingResourceError(f"{label} {path} {problem}; {_EXPECTED}")


def _sniff(path: str) -> str:
    """'zip' (torch.save), 'safetensors', 'pickle' (torch's legacy format) or 'unknown', by content."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:4] == _ZIP_MAGIC:
        return "zip"
    if len(head) == 9 and head[8:9] == b"{":  # u64 little-endian header length, then the JSON header
        return "safetensors"
    if head[:1] == b"\x80":  # pickle protocol opcode
        return "pickle"
    return "unknown"


def _unwrap(obj: Any) -> Any:
    """The state dict inside a training checkpoint ({'state_dict': ...}, {'model': ...}), as the
    libraries unwrap it."""
    if isinstance(obj, Mapping):
        for key in _NESTED_KEYS:
            if isinstance(obj.get(key), Mapping):
                return obj[key]
    return obj


def _load_torch(path: str, kind: str, label: str) -> Any:
    try:
        # mmap: tensors stay on disk until touched, so checking a 600 MB file costs milliseconds.
        return torch.load(path, map_location="cpu", weights_only=True, mmap=kind == "zip")
    except pickle.UnpicklingError as err:
        # torch's own text here advises weights_only=False: never pass that on (hence `from None`).
        if "global" in str(err).lower():  # "Unsupported global: GLOBAL argparse.Namespace ..."
            raise _bad(
                label,
                path,
                "holds Python objects besides tensors, which are refused for safety (weights are loaded with weights_only=True)",
            ) from None
        raise _bad(label, path, "is truncated or corrupt (its pickled index cannot be read)") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        if "TorchScript" in str(err):
            raise _bad(label, path, "is a TorchScript archive, not a state dict") from err
        raise _bad(label, path, "is truncated or corrupt (torch cannot read it)") from err


def open_state_dict(path: str | os.PathLike[str], *, label: str = "model.checkpoint", meta: bool = False) -> dict[str, Tensor]:
    """The state dict in a weights file, opened cheaply, after the checks of :func:`check_checkpoint`.

    torch archives are memory-mapped (tensors are read from disk when touched); a safetensors
    file is opened lazily. With ``meta=True`` the tensors are shape-only ``meta`` tensors (for key
    and shape checks without reading any weight).

    Args:
        path: the weights file.
        label: how the message names the file's origin (``"model.checkpoint"``).
        meta: return ``meta`` tensors (no data).

    Raises:
        MissingResourceError: not a file, empty, truncated or corrupt, not a state dict, or a file
            whose content does not match its suffix (the libraries pick their loader by suffix).
            The message names the path and says what is expected.
    """
    path = os.path.expanduser(os.fspath(path))  # "~/..." as a shell would read it
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise _bad(label, path, f"{what}; give the path of a local weights file")
    if os.path.getsize(path) == 0:
        raise _bad(label, path, "is empty")
    if path.endswith((".npz", ".npy")):
        raise _bad(label, path, "is a numpy archive")
    kind = _sniff(path)
    is_safetensors_name = path.endswith(".safetensors")
    if kind == "safetensors" and not is_safetensors_name:
        raise _bad(
            label,
            path,
            "is a safetensors file whose name does not end in .safetensors (the loaders choose the format by suffix): rename it",
        )
    if is_safetensors_name:
        return _open_safetensors(path, label, meta)
    if kind == "unknown":
        raise _bad(label, path, "is neither a torch archive nor a safetensors file (is it a text file?)")
    state = _unwrap(_load_torch(path, kind, label))
    if not isinstance(state, Mapping):
        raise _bad(label, path, f"holds a {type(state).__name__}, not a state dict (a mapping of names to tensors)")
    not_tensors = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if not state or not_tensors:
        problem = (
            "holds an empty mapping"
            if not state
            else (f"is not a state dict: {len(not_tensors)} entries are not named tensors (e.g. {not_tensors[0]!r})")
        )
        raise _bad(label, path, problem)
    if meta:
        return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}
    return dict(state)


def _open_safetensors(path: str, label: str, meta: bool) -> dict[str, Tensor]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            if meta:
                state = {}
                for k in keys:
                    piece = f.get_slice(k)
                    dtype = _SAFETENSORS_DTYPES.get(piece.get_dtype())
                    if dtype is None:
                        raise _bad(label, path, f"holds tensor {k!r} of unsupported dtype {piece.get_dtype()}")
                    state[k] = torch.empty(piece.get_shape(), dtype=dtype, device="meta")
            else:
                state = {k: f.get_tensor(k) for k in keys}
    except SafetensorError as err:
        problem = "is truncated" if "not fully covered" in str(err) else "is not a valid safetensors file"
        raise _bad(label, path, f"{problem} ({err})") from err
    if not keys:
        raise _bad(label, path, "holds no tensors")
    return state


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def check_checkpoint(path: str | os.PathLike[str], *, label: str = "model.checkpoint") -> None:
    """Cheap readability and format check of a weights file, for a preflight before any model exists.

    Reads only the safetensors header, or the torch archive's index through ``mmap``; no weight is
    loaded. Whether the keys fit the model is checked when the backbone is built.

    Args:
        path: the weights file.
        label: how the message names the file's origin (``"model.checkpoint"``).

    Raises:
        MissingResourceError: see :func:`open_state_dict` (one line naming the path).

    Example:
        >>> check_checkpoint("notes.txt")  # doctest: +SKIP
        MissingResourceError: model.checkpoint notes.txt is neither a torch archive nor a safetensors file ...
    """
    open_state_dict(path, label=label, meta=True)


def key_mismatch_message(
    *,
    label: str,
    path: str,
    model: str,
    missing: Sequence[str],
    unexpected: Sequence[str],
    examples: int = 3,
) -> str:
    """One line saying how the keys of a weights file differ from the model's (counts and examples).

    Args:
        label: the file's origin (``"model.checkpoint"``).
        path: the weights file.
        model: the model in words (``"timm vit_base_patch16_224"``).
        missing: model keys the file does not provide.
        unexpected: file keys the model does not have.
        examples: how many keys of each kind to show.
    """
    parts = []
    for count_of, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            shown = ", ".join(repr(k) for k in list(keys)[:examples])
            more = ", …" if len(keys) > examples else ""
            parts.append(f"{len(keys)} {count_of} (e.g. {shown}{more})")
    return (
        f"{label} {path} does not fit {model}: keys {'; '.join(parts)}; expected a state dict of this "
        f"very model (check model.name and model.overrides against the file)"
    )


_SIZE_MISMATCH = re.compile(
    r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) "
    r"from checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)


def describe_load_error(err: BaseException, *, examples: int = 2) -> str:
    """A short account of why a library could not load a state dict, for a one-line message.

    Shape mismatches (torch's ``load_state_dict`` text) are counted and the first few named as
    ``'key' file [a, b] vs model [c, d]``; any other error gives its first line. torch's advice to
    retry with ``weights_only=False`` is never passed on.
    """
    text = str(err)
    found = _SIZE_MISMATCH.findall(text)
    if found:
        shown = ", ".join(f"{k!r} file {a} vs model {b}" for k, a, b in found[:examples])
        more = ", …" if len(found) > examples else ""
        return f"{len(found)} tensors have the wrong shape (e.g. {shown}{more})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(err).__name__
    if "weights_only" in first.lower() or "weights only" in first.lower():
        return "it holds Python objects besides tensors, which are refused for safety"
    return first
