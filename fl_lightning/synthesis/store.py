"""The synthetic images stored for reading: decoded once into a uint8 array the server's pre-training reads.

``generate_images`` writes PNGs at the VAE's resolution (512 px for SD v1-5) and ``manifest.jsonl``: they stay the
canonical, resumable output. Decoding a 512-px PNG costs 8–14 ms on a core, far more than a ViT step takes per
image on a GPU, and the pre-training decodes every image every epoch. Here each image is decoded once, after
generation, and put through the *head* of the pre-training transform — its leading deterministic steps
(``ToImage``, ``RGB``, and ``Resize`` / ``CenterCrop`` where they come first) — into one uint8 array
``(N, 3, H, W)``; every read then runs the rest of the transform on the stored image:

* the *middle*: what follows the head up to the float part — the random augmentation (``RandomResizedCrop``,
  ``RandomHorizontalFlip``, ...), per item, drawing from the same random streams in the same order as before;
* the *float part*: ``ToDtype(float32, scale=True)`` → clamp → ``Normalize`` → ``ToPureTensor``, elementwise, run
  on the whole gathered batch (``StoredBatch`` and :func:`fl_lightning.data.preprocessed.collate`).

The transform is the same composition cut in two places, so every item equals the PNG path's item bit for bit
(``mode="exact"``, tests/synthesis/test_store.py). Where the training transform starts with a random step on the
decoded image (the imagenet pipeline's ``RandomResizedCrop`` at ≥ 32 px), its head is ``ToImage`` / ``RGB`` only:
the training split's store keeps the images at their generated size (768 KiB per 512-px image), the held-out
split's at the input size (147 KiB at 224 px). ``mode="input"`` stores every split at the input size (the
held-out transform's head) and lets the training crop resample the stored image instead of the generated one:
one store of 147 KiB per image, no longer bit-identical (the crops come from a 224-px image, not a 512-px one).

**Format and key.** ``<folder>/.store/<key>.npy``: a NumPy ``.npy`` array, uint8, (N, 3, H, W) in manifest order,
read memory-mapped (``np.load(mmap_mode="r")``: the pages are shared by the processes that read it). ``key`` is
the first 16 hex digits of a SHA-256 over the format version, the manifest's bytes, every image file's size and
modification time, the head's ``repr`` (sizes, interpolation, antialias) and the torchvision and Pillow versions: a
changed folder (a resumed or regenerated image, another manifest) or another input size makes another key and the
store is built again; stale stores in ``.store`` are removed when a new one is built, and the pre-training removes
its store when it has finished (:func:`remove_stores`). A store is written under a temporary name and renamed, so a
store that exists is whole. Over the ranks of a shared server phase every rank decodes its block of rows
(:func:`build_stores`), and the store is the one a single rank writes, byte for byte.

**Checked before reuse.** The key names what a store was made *from*; ``<key>.json`` beside it records what it
*holds* — its shape and the SHA-256 of its bytes — and is written before the store is renamed into place. A store
is reused only when it opens, has the recorded shape with one image per manifest row, and hashes to the recorded
digest; otherwise (a truncated or replaced file, other pixels of the right shape, no record) one warning names the
file and why, and it is built again — a cache is never trained on unchecked, and never blocks later runs. The
check reads the store once (1.7 GiB/s on a 2-core CI machine: ≈ 4 s for 10,000 training images at 512 px, next to
the ≈ 100 s their decoding took). The blocks of a new store are reserved before it is filled (``posix_fallocate``),
so a full disk is one line (:class:`~fl_lightning.errors.DiskFullError`), not a SIGBUS on the memory map.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from fl_lightning.data.preprocessed import StoredBatch
from fl_lightning.dealing import Deal
from fl_lightning.federation.storage.checkpoint import reserved_memmap
from fl_lightning.synthesis.generate import MANIFEST_NAME

if TYPE_CHECKING:
    from fl_lightning.federation.ranks.collectives import Ranks

__all__ = [
    "STORE_DIR",
    "STORE_MODES",
    "TransformParts",
    "array_digest",
    "split_transform",
    "store_key",
    "build_stores",
    "remove_stores",
    "StoredImages",
    "stored_splits",
]

STORE_DIR = ".store"  # under the synthetic folder
STORE_MODES = ("exact", "input", "off")
_FORMAT = 1
_HEAD_STEPS: tuple[type, ...] = (v2.ToImage, v2.RGB, v2.Resize, v2.CenterCrop)
_HASH_CHUNK = 64 << 20  # bytes hashed at a time: the store is read through its map, never loaded whole


class TransformParts:
    """A ``v2.Compose`` cut into ``head`` (run once, stored), ``middle`` (per item) and ``finish`` (per batch)."""

    def __init__(self, head: v2.Compose, middle: v2.Compose, finish: v2.Compose) -> None:
        self.head, self.middle, self.finish = head, middle, finish


def _elementwise(step: Any) -> bool:
    if isinstance(step, v2.Lambda):
        return getattr(step.lambd, "__module__", "").startswith("fl_lightning.")  # this package's clamp
    return type(step) in (v2.ToDtype, v2.Normalize, v2.ToPureTensor)


def split_transform(transform: Any) -> TransformParts | None:
    """``transform`` as head / middle / finish (module docstring), or None when it does not start with
    ``ToImage`` (a store holds uint8 image tensors)."""
    if not isinstance(transform, v2.Compose) or not transform.transforms or type(transform.transforms[0]) is not v2.ToImage:
        return None
    steps = list(transform.transforms)
    cut = 0
    while cut < len(steps) and type(steps[cut]) in _HEAD_STEPS:
        cut += 1
    rest = steps[cut:]
    at = next((i for i, t in enumerate(rest) if type(t) is v2.ToDtype and t.dtype is torch.float32 and t.scale), None)
    if at is None or not all(_elementwise(t) for t in rest[at:]):
        at = len(rest)  # no elementwise float part: everything after the head runs per item
    return TransformParts(_compose(steps[:cut]), _compose(rest[:at]), _compose(rest[at:]))


def _compose(steps: list[Any]) -> v2.Compose:
    return v2.Compose(steps or [v2.Identity()])  # Compose refuses an empty list


def _manifest(folder: Path) -> tuple[bytes, list[tuple[str, int]]]:
    raw = (folder / MANIFEST_NAME).read_bytes()
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line]
    return raw, [(row["path"], int(row["label"])) for row in rows]


def store_key(folder: Path, head: v2.Compose) -> str:
    """The content key of ``folder``'s store for ``head`` (module docstring)."""
    import PIL
    import torchvision

    raw, items = _manifest(folder)
    digest = hashlib.sha256()
    digest.update(
        json.dumps(
            {"format": _FORMAT, "head": repr(head), "torchvision": torchvision.__version__, "pillow": PIL.__version__}
        ).encode()
    )
    digest.update(hashlib.sha256(raw).digest())
    for path, _ in items:
        st = (folder / path).stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _decode(path: Path) -> Image.Image:
    with Image.open(path) as img:
        return img.convert("RGB")  # as SyntheticFolder reads it


def array_digest(array: np.ndarray) -> str:
    """SHA-256 of ``array``'s bytes in C order, read ``_HASH_CHUNK`` bytes at a time (a memory map stays a map)."""
    flat = array.reshape(-1).view(np.uint8) if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(-1)
    digest = hashlib.sha256()
    for start in range(0, flat.size, _HASH_CHUNK):
        digest.update(flat[start : start + _HASH_CHUNK])
    return digest.hexdigest()


def _record_path(store: Path) -> Path:
    return store.with_suffix(".json")  # <key>.json beside <key>.npy


def _unusable(store: Path, num_items: int) -> str | None:
    """Why the store at ``store`` cannot be reused (module docstring), or None when it holds what its record says."""
    try:
        record = json.loads(_record_path(store).read_text(encoding="utf-8"))
        shape, digest = tuple(record["shape"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "it has no readable record of its content (<key>.json)"
    try:
        array = np.load(store, mmap_mode="r")
    except (OSError, ValueError) as err:
        return f"it cannot be opened ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    if array.dtype != np.uint8 or array.shape != shape or array.shape[0] != num_items:
        return f"it holds {array.dtype} {array.shape}, its record {shape} for {num_items} images"
    if array_digest(array) != digest:
        return "its bytes are not those it was written with (another store's images, or an edited file)"
    return None


def _checked_stores(paths: Sequence[Path], num_items: int) -> list[Path]:
    """The paths among ``paths`` that hold a store fit for reuse; the others removed with one warning each."""
    import warnings

    fit = []
    for path in paths:
        if not path.is_file():
            continue
        why = _unusable(path, num_items)
        if why is None:
            fit.append(path)
            continue
        warnings.warn(f"the synthetic image store '{path}' is built again: {why}", stacklevel=3)
        path.unlink(missing_ok=True)
        _record_path(path).unlink(missing_ok=True)
    return fit


def build_stores(folder: str | os.PathLike[str], heads: Sequence[v2.Compose], ranks: Ranks | None = None) -> list[Path]:
    """The store of ``folder`` for each head (built where missing or unfit for reuse, every image decoded once for
    all of them).

    With ``ranks`` (every rank of a shared server phase calls this together) the decoding is dealt over them: rank 0
    checks what is there and reserves the new stores, every rank fills its block of rows ``[n·r/N, n·(r+1)/N)``
    (:meth:`~fl_lightning.dealing.Deal.blocks`), and rank 0 checks each block against the digest its rank reported
    (a shared file system that lost a rank's pages is one line, not a store trained on), records the store's digest
    and renames it into place. The store's bytes are those one rank writes.

    Returns:
        the ``.npy`` paths, in the order of ``heads``.

    Raises:
        ValueError: a head's output is not a uint8 image of one shape for every image (on every rank alike).
        DiskFullError: the disk has no room for a store (one line; nothing is left behind).
    """
    folder = Path(folder)
    _, items = _manifest(folder)
    keys = [store_key(folder, head) for head in heads]
    paths = [folder / STORE_DIR / f"{key}.npy" for key in keys]
    on_server = (lambda step, what: step()) if ranks is None else ranks.on_server
    gather = (lambda step, what: [step()]) if ranks is None else ranks.gather
    deal = Deal(0, 1) if ranks is None else ranks.deal
    what = "the synthetic images' store"
    todo, problem = on_server(lambda: _reserve(folder, items, dict(zip(keys, heads)), dict(zip(keys, paths))), what)
    if problem is not None:
        raise ValueError(problem)
    if not todo:
        return paths
    rows = deal.blocks(len(items))  # in blocks: rank 0 checks each block against its rank's digest
    committed = False
    try:
        blocks = gather(lambda: _fill(folder, items, {k: heads[keys.index(k)] for k in todo}, todo, rows), what)
        problem = next((p for p, _, _ in blocks if p is not None), None)
        if problem is not None:
            raise ValueError(problem)  # every rank alike: each read the same blocks
        on_server(lambda: _commit(folder, todo, dict(zip(keys, paths)), blocks, paths), what)
        committed = True
    finally:
        if not committed and deal.rank == 0:  # refused or failed on any rank: no temporary store stays behind
            for tmp, _ in todo.values():
                tmp.unlink(missing_ok=True)
    return paths


def _reserve(
    folder: Path, items: list[tuple[str, int]], heads: dict[str, v2.Compose], paths: dict[str, Path]
) -> tuple[dict[str, tuple[Path, tuple[int, ...]]], str | None]:
    """Rank 0: the stores to build, each reserved under a temporary name with the first image's shape (removing the
    unfit ones); or why the images cannot be stored."""
    fit = _checked_stores(list(paths.values()), len(items))
    need = [key for key, path in paths.items() if path not in fit]
    if not need:
        return {}, None
    paths[need[0]].parent.mkdir(parents=True, exist_ok=True)
    image, rel = _decode(folder / items[0][0]), items[0][0]
    todo: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for key in need:
        x = heads[key](image)
        if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.ndim == 3):
            return {}, f"the store's head {heads[key]!r} does not make a uint8 (C, H, W) image of {rel}"
        tmp = paths[key].with_name(f"{paths[key].name}.{os.getpid()}.tmp")
        try:
            reserved_memmap(tmp, (len(items), *x.shape), np.uint8).flush()
        except BaseException:
            for made, _ in todo.values():
                made.unlink(missing_ok=True)
            raise
        todo[key] = (tmp, tuple(x.shape))
    return todo, None


def _fill(
    folder: Path,
    items: list[tuple[str, int]],
    heads: dict[str, v2.Compose],
    todo: dict[str, tuple[Path, tuple[int, ...]]],
    rows: range,
) -> tuple[str | None, dict[str, str], tuple[int, int]]:
    """This rank's block of rows of every reserved store, decoded once for all heads: (a problem or None, the
    SHA-256 of each store's block as written, the block's first row and the row after its last)."""
    arrays = {key: np.load(tmp, mmap_mode="r+") for key, (tmp, _) in todo.items()}
    try:
        for i in rows:
            rel = items[i][0]
            image = _decode(folder / rel)
            for key, head in heads.items():
                x = head(image)
                if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and tuple(x.shape) == todo[key][1]):
                    shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                    return (
                        (
                            f"{rel}: the store's head makes {shape}, the first image {todo[key][1]} (images of one "
                            f"size are stored)"
                        ),
                        {},
                        (rows.start, rows.stop),
                    )
                arrays[key][i] = x.as_subclass(torch.Tensor).numpy()
        for array in arrays.values():
            array.flush()
        return None, {key: array_digest(array[rows.start : rows.stop]) for key, array in arrays.items()}, (rows.start, rows.stop)
    finally:
        arrays.clear()


def _commit(
    folder: Path,
    todo: dict[str, tuple[Path, tuple[int, ...]]],
    paths: dict[str, Path],
    blocks: list[tuple[str | None, dict[str, str], tuple[int, int]]],
    kept_paths: list[Path],
) -> None:
    """Rank 0: each new store checked block by block against what its rank wrote, its record written, then the store
    renamed into place (a store in place always has its record); other keys' stores and leftovers removed."""
    for key, (tmp, _) in todo.items():
        array = np.load(tmp, mmap_mode="r")  # opened again: what every rank's writes left in the file
        for rank, (_, digests, (first, end)) in enumerate(blocks):
            if array_digest(array[first:end]) != digests[key]:
                raise RuntimeError(
                    f"the synthetic image store '{tmp}': rows {first}–{end - 1} are not what "
                    f"rank {rank} wrote (a file system that does not keep concurrent writers' "
                    f"pages); nothing was kept: run the pre-training on one node, or put the run "
                    f"folder on a file system that does"
                )
        record = {"shape": list(array.shape), "sha256": array_digest(array)}
        del array
        path = paths[key]
        _record_path(path).write_text(json.dumps(record), encoding="utf-8")  # before the store: a store
        os.replace(tmp, path)  # in place always has its record
    root = folder / STORE_DIR
    kept = {*kept_paths, *map(_record_path, kept_paths)}
    for stale in [*root.glob("*.npy"), *root.glob("*.json"), *root.glob("*.tmp")]:  # other keys', a killed
        if stale not in kept:  # build's leftovers
            stale.unlink(missing_ok=True)


def _build_or_none(folder: Path, heads: Sequence[v2.Compose], ranks: Ranks | None = None) -> list[Path] | None:
    """:func:`build_stores`, or None (the caller reads the PNGs) for a folder it cannot store: no image, or images
    whose head makes more than one shape (one warning; every rank alike)."""
    import warnings

    if not _manifest(folder)[1]:
        return None
    try:
        return build_stores(folder, heads, ranks)
    except ValueError as err:
        if ranks is None or ranks.rank == 0:
            warnings.warn(f"the synthetic images are read from their PNGs: {err}", stacklevel=2)
        return None


def remove_stores(folder: str | os.PathLike[str]) -> None:
    """Delete ``folder``'s stores (a cache of the PNGs: the pre-training that read them has finished)."""
    root = Path(folder) / STORE_DIR
    for path in [*root.glob("*.npy"), *root.glob("*.json"), *root.glob("*.tmp")]:
        path.unlink(missing_ok=True)
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()


class StoredImages(Dataset):
    """The synthetic folder's ``(image, label)`` items read from a store: ``finish(middle(store[i]))``.

    ``__getitems__`` (what ``DataLoader`` and ``Subset`` call) runs the middle per item, in order, and hands the
    float part on with the stacked uint8 batch (:class:`~fl_lightning.data.preprocessed.StoredBatch`), which
    :func:`fl_lightning.data.preprocessed.collate` runs on the whole batch at once. With ``defer`` the items stay
    uint8 and the float part is left to the reader (``deferred``): the pre-training runs it on its device.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        labels: Sequence[int],
        middle: Callable[[Any], Any],
        finish: Callable[[torch.Tensor], torch.Tensor],
        *,
        defer: bool = False,
    ) -> None:
        self.path = Path(path)
        self._images: np.ndarray | None = None
        if len(self.images) != len(labels):
            raise ValueError(f"{self.path} holds {len(self.images)} images, the manifest {len(labels)}")
        self.labels = [int(v) for v in labels]
        self.middle = middle
        # defer: items stay uint8 and the reader runs ``deferred`` on each batch (pre-training: on its device)
        self.finish, self.deferred = (None, finish) if defer else (finish, None)

    @property
    def images(self) -> np.ndarray:
        """The store, memory-mapped (opened again in a process this data set was pickled to)."""
        if self._images is None:
            self._images = np.load(self.path, mmap_mode="r")
        return self._images

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_images": None}  # a loader worker maps the file itself: no copy of the array

    def __len__(self) -> int:
        return len(self.labels)

    def _image(self, index: int) -> torch.Tensor:
        x = tv_tensors.Image(torch.from_numpy(np.array(self.images[index])))  # a copy out of the map
        return self.middle(x).as_subclass(torch.Tensor)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self._image(int(index))
        return (x if self.finish is None else self.finish(x)), self.labels[int(index)]

    def __getitems__(self, indices: Sequence[int]) -> StoredBatch:
        inputs = torch.stack([self._image(int(i)) for i in indices])
        return StoredBatch(inputs, [self.labels[int(i)] for i in indices], self.finish)


def stored_splits(
    folder: str | os.PathLike[str],
    train_transform: v2.Compose,
    val_transform: v2.Compose,
    *,
    mode: str = "exact",
    ranks: Ranks | None = None,
    defer: bool = False,
) -> tuple[StoredImages, StoredImages] | None:
    """The whole folder read through a store with each split's transform, or None (``mode="off"``, a transform this
    cannot cut, or a folder it cannot store — no image, or images of more than one size where the store keeps the
    generated size: the caller reads the PNGs).

    Args:
        folder: the synthetic folder (``manifest.jsonl`` and the PNGs).
        train_transform, val_transform: the pre-training's two transforms.
        mode: ``exact`` (each split's own head: bit-identical), ``input`` (both at the held-out head's input size)
            or ``off``.
        ranks: every rank of a shared server phase, which all call this together: the store's build is dealt over
            them (:func:`build_stores`); None: this process alone.
        defer: leave the float part to the reader when both splits have the same one (``StoredImages.deferred``:
            uint8 batches, a quarter of the bytes to move to a GPU, and the float part runs there).
    """
    if mode not in STORE_MODES:
        raise ValueError(f"mode={mode!r} is not allowed; expected one of {list(STORE_MODES)}")
    train, val = split_transform(train_transform), split_transform(val_transform)
    if mode == "off" or train is None or val is None:
        return None
    if mode == "input":  # the training split's own head replaced: its middle runs on the input-size image
        train = TransformParts(val.head, train.middle, train.finish)
    folder = Path(folder)
    heads = [train.head] if repr(train.head) == repr(val.head) else [train.head, val.head]
    paths = _build_or_none(folder, heads, ranks)
    if paths is None:
        return None
    labels = [label for _, label in _manifest(folder)[1]]
    train_path, val_path = paths[0], paths[-1]
    defer = (
        defer
        and repr(train.finish) == repr(val.finish)
        and len(train.finish.transforms) > 0
        and type(train.finish.transforms[0]) is v2.ToDtype
    )
    return (
        StoredImages(train_path, labels, train.middle, train.finish, defer=defer),
        StoredImages(val_path, labels, val.middle, val.finish, defer=defer),
    )
