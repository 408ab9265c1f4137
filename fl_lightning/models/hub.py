"""One rule for anything named by a Hugging Face hub id or a local path: data sets and weights.

A value is a **local path** when it exists on disk (used as it is), else a **hub id** (``org/name``)
looked up in the Hugging Face hub cache — ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
huggingface_hub's default, read at each call — with ``snapshot_download(..., local_files_only=True)``:
no request is made. Only with ``download`` (``data.download`` / ``model.download``) is the snapshot
fetched into that cache. What is not there is one :class:`~fl_lightning.errors.MissingResourceError`
line naming the id, where it looked and the command that fetches it. The library never sets
``HF_HUB_OFFLINE`` itself: being offline is decided per call.

A hub id may carry a **revision**: ``org/name@<branch, tag or commit>`` reads that snapshot of the cache
(``refs/<branch or tag>``, or ``snapshots/<commit>``) instead of ``main`` — every weight key takes it, and a
data set's ``data.revision`` is passed here the same way (:func:`hub_snapshot`).
"""

from __future__ import annotations

import os
from pathlib import Path

from fl_lightning.errors import MissingResourceError

__all__ = [
    "WEIGHT_FILES",
    "hub_cache_dir",
    "hub_snapshot",
    "resolve_local_or_hub",
    "resolve_weights_file",
    "looks_like_hub_id",
    "fetch_command",
    "hub_cached",
    "missing_weights_phrase",
    "split_revision",
]

#: The weights file a folder (or a hub snapshot) is read from, best first: timm's, open_clip's, transformers'.
WEIGHT_FILES = (
    "model.safetensors",
    "open_clip_model.safetensors",
    "pytorch_model.bin",
    "open_clip_pytorch_model.bin",
    "model.pth",
    "model.pt",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


def hub_cache_dir(cache_dir: str | None = None) -> str:
    """The hub cache a lookup searches: ``cache_dir``, ``HF_HUB_CACHE``, ``$HF_HOME/hub``, or huggingface_hub's
    default (which it fixed when it was imported)."""
    if cache_dir:
        return os.path.expanduser(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def split_revision(value: str) -> tuple[str, str | None]:
    """``org/name@rev`` → ``("org/name", "rev")``; a value without ``@`` → ``(value, None)``."""
    repo_id, sep, revision = value.rpartition("@")
    return (repo_id, revision) if sep and repo_id and revision and "/" not in revision else (value, None)


def looks_like_hub_id(value: str) -> bool:
    """``name`` or ``org/name``, optionally ``@revision`` (no leading ``/``, ``.`` or ``~``, no file suffix):
    what the hub could hold."""
    value = split_revision(value)[0]
    parts = value.split("/")
    return (
        not value.startswith((".", "/", "~"))
        and 1 <= len(parts) <= 2
        and all(parts)
        and not any(p.endswith((".parquet", ".arrow", ".pt", ".pth", ".bin", ".safetensors")) for p in parts)
    )


def fetch_command(repo_id: str, repo_type: str = "model", revision: str | None = None) -> str:
    """The shell command that puts ``repo_id`` (at ``revision``) into the hub cache on a machine with internet."""
    repo_id, given = split_revision(repo_id)
    revision = revision or given
    kind = f" --repo-type {repo_type}" if repo_type != "model" else ""
    return f"hf download {repo_id}{kind}" + (f" --revision {revision}" if revision else "")


def _with_revision(repo_id: str, revision: str | None, key: str) -> tuple[str, str | None]:
    """The bare id and the revision, from ``org/name@rev`` or the ``revision`` argument (not both, unless equal)."""
    bare, given = split_revision(repo_id)
    if given and revision and given != revision:
        from fl_lightning.errors import UsageError  # a pure layer raises the one line as a usage error

        raise UsageError(
            f"config error: {key}={repo_id!r} is not allowed; expected one revision: '@{given}' in the id "
            f"or the revision key {revision!r}, not both"
        )
    return bare, revision or given


def hub_snapshot(
    repo_id: str,
    *,
    repo_type: str = "model",
    download: bool,
    key: str,
    download_key: str,
    cache_dir: str | None = None,
    revision: str | None = None,
) -> str:
    """The local snapshot folder of ``repo_id`` in the hub cache (fetched first only when ``download``).

    Args:
        repo_id: ``org/name``, or ``org/name@revision``.
        revision: a branch, tag or commit (None: ``main``, or the id's ``@revision``).
        repo_type: ``'model'`` or ``'dataset'``.
        download: fetch a missing snapshot into the cache.
        key: the config key that named it (for the message).
        download_key: the key that allows downloading (``model.download``, ``data.download``).
        cache_dir: the hub cache to use (None: :func:`hub_cache_dir`).

    Raises:
        MissingResourceError: not in the cache (downloading off), or the download failed.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    named = repo_id
    repo_id, revision = _with_revision(repo_id, revision, key)
    cache = hub_cache_dir(cache_dir)
    where = os.path.join(cache, f"{repo_type}s--{repo_id.replace('/', '--')}")
    at = f" at revision {revision!r}" if revision else ""
    fetch = fetch_command(repo_id, repo_type, revision)
    try:
        return snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache, local_files_only=not download, revision=revision)
    except LocalEntryNotFoundError:
        if download:  # asked to fetch, yet the library found nothing to fetch from
            raise MissingResourceError(
                f"{key}={named!r}{at} could not be downloaded into {cache} (no connection to "
                f"the hub?); on a machine with internet run "
                f"`{fetch}` and copy {where} here"
            ) from None
        raise MissingResourceError(
            f"{key}={named!r}{at} is not in the Hugging Face cache (looked in {where}; "
            f"downloading is off): run `{fetch}` on a machine "
            f"with internet (and copy the cache here), set {download_key}: true, or give a "
            f"local path"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:  # unknown repo, gated, no network ...
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise MissingResourceError(
            f"{key}={named!r}{at} could not be fetched into {cache} ({reason}); run "
            f"`{fetch}` on a machine with internet, or give a "
            f"local path"
        ) from None


def resolve_local_or_hub(
    value: str, *, download: bool, key: str, download_key: str, what: str, repo_type: str = "model", cache_dir: str | None = None
) -> Path:
    """A local folder for ``value``: the path itself when it exists, else the hub id's cached snapshot.

    Args:
        value: a local path or a hub id.
        download, key, download_key, repo_type, cache_dir: see :func:`hub_snapshot`.
        what: the weights in words (``"a diffusers Stable Diffusion folder"``), for the message.

    Raises:
        MissingResourceError: a path that does not exist and is no hub id, or a hub id not in the cache.
    """
    local = Path(value).expanduser()
    if local.exists():
        return local
    if not looks_like_hub_id(value):
        raise MissingResourceError(f"{key}={value!r} does not exist; give {what} or a hub id (org/name)")
    return Path(
        hub_snapshot(value, repo_type=repo_type, download=download, key=key, download_key=download_key, cache_dir=cache_dir)
    )


def resolve_weights_file(
    value: str,
    *,
    download: bool,
    key: str = "model.checkpoint",
    download_key: str = "model.download",
    cache_dir: str | None = None,
) -> str:
    """The weights file that ``value`` names: a file as it is; a folder's (or a hub id's snapshot's) weights file.

    A folder gives the first of :data:`WEIGHT_FILES` in it, else its only ``.safetensors/.bin/.pth/.pt``
    file. A path that does not exist and is no hub id is returned as given (``~`` expanded), so that the
    loaders report it in their own words ("is not a file").

    Raises:
        MissingResourceError: a hub id not in the cache (downloading off), or a folder without a weights file.
    """
    local = Path(value).expanduser()
    if local.is_file() or (not local.exists() and not looks_like_hub_id(value)):
        return str(local)
    folder = resolve_local_or_hub(
        value,
        download=download,
        key=key,
        download_key=download_key,
        cache_dir=cache_dir,
        what="a weights file (.pt, .pth, .bin, .safetensors) or a folder holding one",
    )
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return str(folder / name)
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if len(found) == 1:
        return str(found[0])
    held = f"{len(found)} weights files" if found else "no weights file"
    raise MissingResourceError(
        f"{key}={value!r}: the folder {folder} holds {held} (looked for {', '.join(WEIGHT_FILES)}); name the file itself"
    )


def hub_cached(repo_id: str, *, repo_type: str = "model", cache_dir: str | None = None) -> bool:
    """Whether a snapshot of ``repo_id`` (``org/name@revision``: that revision's) is in the hub cache (no request
    is made)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, revision = split_revision(repo_id)
    try:
        snapshot_download(
            repo_id, repo_type=repo_type, cache_dir=hub_cache_dir(cache_dir), local_files_only=True, revision=revision
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        return False
    return True


def missing_weights_phrase(value: str, *, key: str, what: str, download: bool, folder: bool = True) -> str | None:
    """For a preflight: a phrase naming ``key`` when ``value`` (a local path or hub id) cannot be had, else None.

    A local path must exist (as a folder when ``folder``); a hub id must be in the cache — with ``download``
    it is fetched into the cache here, once, before any process starts (every later lookup is offline);
    otherwise no request is made.
    """
    local = Path(value).expanduser()
    if local.exists():
        return None if local.is_dir() or not folder else f"{key}={value} ({what}; it is a file, not a folder)"
    if not looks_like_hub_id(value):
        return f"{key}={value} ({what})"
    if download:
        try:
            hub_snapshot(value, download=True, key=key, download_key="model.download")
        except MissingResourceError as err:
            return str(err)
        return None
    if hub_cached(value):
        return None
    where = os.path.join(hub_cache_dir(), f"models--{split_revision(value)[0].replace('/', '--')}")
    return (
        f"{key}={value} ({what}; not in the Hugging Face cache, looked in {where}: run `{fetch_command(value)}` "
        f"on a machine with internet, or set model.download: true)"
    )
