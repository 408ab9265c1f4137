"""Hugging Face ``datasets`` as a data set of the registry (``data.name: hf``).

``data.path`` names the data: a **hub id** (``uoft-cs/cifar10``), read from the Hugging Face hub cache
(``HF_HUB_CACHE``, else ``$HF_HOME/hub``) and downloaded into it only with ``data.download: true``; or a
**local path**: a folder written by ``save_to_disk``, one ``.parquet`` / ``.arrow`` file, or a folder
of them (``train-*.parquet``, ``test-*.parquet`` name the splits, as on the hub). A hub id resolves to
its snapshot folder with ``huggingface_hub.snapshot_download(..., local_files_only=not download)``,
the rule every weight follows too (:mod:`fl_lightning.models.hub`), and the folder is then read like a
local one — no request is made unless ``download`` is true, whatever the environment says.

Rows are read through the ``datasets`` library (memory-mapped Arrow): building the splits reads only
the label column; an image is decoded when its item is read, converted to RGB and passed through the
split's transform, so the preprocessed cache and the feature cache apply as to every data set. The
splits carry a fingerprint (the ``datasets`` fingerprints of both splits, the columns used, where it was read
from and ``data.revision``), which is part of the feature cache's key. ``data.revision`` (a branch, tag or
commit) picks a hub id's snapshot, as ``datasets.load_dataset(..., revision=)`` would.

Columns: ``data.image_column`` (default: the first ``Image`` feature, else a column named ``image``,
``img`` or ``picture``; a column of strings or numbers is refused, whatever its name) and
``data.label_column`` (default: the one column that can hold the labels — a ``ClassLabel`` feature, or an
integer or string column named ``label`` / ``labels``; among several, the one named ``label`` / ``labels``
if exactly one is; with none, an integer or string column named ``fine_label``, ``target`` or ``class``).
A ``ClassLabel`` gives the class names; other labels are numbered in sorted order of their values. When a
column cannot be found, or more than one could be the labels, the error is one line listing them.

Bad inputs end as one line (:class:`~fl_lightning.errors.UsageError`), never a traceback: a truncated or
garbage ``.parquet`` / ``.arrow`` file (naming the file and the folder), a ``partition.by`` column with
nulls or of images, a path that exists neither on disk nor in the hub cache (naming the absolute path it
looked at, and ``HF_HUB_OFFLINE`` when that stops a download). A ``partition.by`` column with one distinct
value is a warning: the run trains centrally. ``datasets`` is imported only here, when such a data set is
built.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from fl_lightning.data.splits import IMAGE_ERRORS, CorruptImageError, DatasetSplits, limit_train, split_4_to_1
from fl_lightning.errors import ConfigError, MissingResourceError, UsageError

__all__ = [
    "HF_PREFIX",
    "HFSource",
    "HFImages",
    "build_hf_dataset",
    "column_values",
    "datasets_cache_dir",
    "hf_shorthand",
    "hf_source",
    "hub_folder",
]

HF_PREFIX = "hf:"  # data.name: hf:<id> is name: hf with path: <id>

_IMAGE_NAMES = ("image", "img", "picture")
_PREFERRED_LABELS = ("label", "labels")  # a column named so wins over other ClassLabel columns (a domain, …)
_FALLBACK_LABELS = ("fine_label", "target", "class")  # looked for only where no column above could be the labels
_DATA_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class HFSource:
    """Where a Hugging Face data set is and which of its parts a run reads.

    Attributes:
        path: a hub id (``org/name``) or a local path (``save_to_disk`` folder, parquet/arrow files).
        train_split: the split the clients share.
        test_split: the split the global model is evaluated on; None: a seeded 4:1 split of
            ``train_split`` (stratified by class).
        image_column: the images; None: found from the features.
        label_column: the integer or string labels; None: found from the features.
        revision: for a hub id, the branch, tag or commit of the dataset repository to read (None: ``main``);
            a local path is one version already, so a revision beside one is an error.
        cache_dir: the hub cache of a hub id's snapshot, with datasets' Arrow tables in ``<cache_dir>/datasets``
            (None: the environment's, :func:`datasets_cache_dir`).
    """

    path: str | None = None
    train_split: str = "train"
    test_split: str | None = "test"
    image_column: str | None = None
    label_column: str | None = None
    revision: str | None = None
    cache_dir: str | None = None


def hf_source(data: Any) -> HFSource:
    """The ``data.*`` keys (a :class:`~fl_lightning.config.DataConfig`) a Hugging Face data set reads (``data.name: hf``)."""
    return HFSource(**{f.name: getattr(data, f.name) for f in fields(HFSource)})  # the keys of the same names


def hf_shorthand(name: str, path: str | None, *, key_prefix: str = "") -> tuple[str, str | None]:
    """``data.name: hf:<id>`` read as ``name: hf`` with ``path: <id>`` (a hub id or a local path); any other
    name is returned as it is, with ``path``.

    Args:
        name, path: the ``data.name`` and ``data.path`` values.
        key_prefix: put before the keys in an error (``"data."``; a config section adds its own).

    Raises:
        ConfigError: ``hf:`` with nothing after it, or a ``path`` naming another data set than the name does.
    """
    if not isinstance(name, str) or not name.startswith(HF_PREFIX):
        return name, path
    target = name[len(HF_PREFIX) :].strip()
    if not target:
        raise ConfigError(
            f"{key_prefix}name", name, "hf:<hub id or local path> (e.g. hf:uoft-cs/cifar10), or name: hf with data.path"
        )
    if path and path != target:
        raise ConfigError(f"{key_prefix}path", path, f"null or {target!r}: data.name {name!r} names the data set")
    return "hf", target


def datasets_cache_dir(cache_dir: str | None = None) -> str:
    """Where ``datasets`` keeps its Arrow tables: ``<cache_dir>/datasets`` (``data.cache_dir``), else
    ``HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``, else the library's default — read per call, so that a
    process (or a test) that sets the variables is obeyed."""
    if cache_dir:
        return os.path.join(os.path.expanduser(cache_dir), "datasets")
    if os.environ.get("HF_DATASETS_CACHE"):
        return os.path.expanduser(os.environ["HF_DATASETS_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "datasets")
    import datasets

    return str(datasets.config.HF_DATASETS_CACHE)


def _is_saved_to_disk(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _load_local(path: Path, download: bool, cache_dir: str | None = None) -> Any:
    """A ``DatasetDict`` (or one ``Dataset``) from a local folder or file.

    Raises:
        UsageError: a file that is no .parquet / .arrow, a folder without data, or a damaged data file (one line
            naming the file and ``path``).
    """
    try:
        return _read_local(path, download, cache_dir)
    except UsageError:
        raise
    except Exception as err:  # pyarrow's error, or datasets' DatasetGenerationError around it
        damage = _damage(err)
        if damage is None:
            raise
        raise UsageError(_damaged_line(path, damage)) from None


def _read_local(path: Path, download: bool, cache_dir: str | None = None) -> Any:
    """:func:`_load_local` without the translation of a damaged file's error."""
    import datasets

    if path.is_dir() and _is_saved_to_disk(path):
        return datasets.load_from_disk(str(path))
    if path.is_file():
        builder = _DATA_SUFFIXES.get(path.suffix)
        if builder is None:
            raise UsageError(
                f"data.path '{path}' is a {path.suffix or 'suffix-less'} file; expected a .parquet or "
                f".arrow file, a folder of them, or a folder written by save_to_disk"
            )
        return datasets.load_dataset(builder, data_files={"train": str(path)}, cache_dir=datasets_cache_dir(cache_dir))
    try:  # a folder of data files (a hub snapshot): the library infers the splits from the file names
        return datasets.load_dataset(
            str(path), cache_dir=datasets_cache_dir(cache_dir), download_mode=None if download else "reuse_dataset_if_exists"
        )
    except (FileNotFoundError, ValueError) as err:  # "Unable to find …", "… doesn't contain any data files"
        if _damage(err) is not None:  # pyarrow's ArrowInvalid is a ValueError too: a damaged file, said by the caller
            raise
        reason = " ".join(str(err).split())
        raise UsageError(
            f"data.path '{path}' holds no data set datasets can read ({reason}); expected a folder "
            f"written by save_to_disk, or .parquet / .arrow files"
        ) from None


def _damage(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain (``err``, its cause, …) that says a data file is unreadable — pyarrow's (not out
    of memory), or the bare ``OSError`` pyarrow raises for a truncated Arrow stream — else None."""
    import pyarrow as pa

    while err is not None:
        if isinstance(err, pa.ArrowException) and not isinstance(err, MemoryError):
            return err
        if type(err) is OSError and err.errno is None:  # not a system error: no space, no permission, …
            return err
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return None


def _read_through(file: Path) -> None:
    """Read what pyarrow needs to open ``file``: a parquet file's footer, every record batch of an Arrow file
    (memory-mapped: nothing is copied). Raises pyarrow's error (or an ``OSError``) where it is damaged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file.suffix == ".parquet":
        pq.read_metadata(str(file))
        return
    with pa.memory_map(str(file)) as source:
        try:  # save_to_disk and datasets' cache write the stream format
            for _ in pa.ipc.open_stream(source):
                pass
        except pa.ArrowInvalid:  # … else the file format
            source.seek(0)
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                reader.get_batch(i)


def _first_unreadable(path: Path) -> Path | None:
    """``path`` (a file), or the first .parquet / .arrow file under the folder ``path``, that pyarrow cannot read."""
    import pyarrow as pa

    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in _DATA_SUFFIXES)
    for file in files:
        try:
            _read_through(file)
        except (pa.ArrowException, OSError):
            return file
    return None


def _damaged_line(path: Path, damage: BaseException) -> str:
    """The one line for data under ``path`` that pyarrow could not read (``damage``): the file, and what to do."""
    reason = " ".join(str(damage).split()) or type(damage).__name__
    bad = _first_unreadable(path)
    if bad is None:  # a failure no single file shows (e.g. files whose schemas differ)
        return f"data.path '{path}' cannot be read ({reason}); check its .parquet / .arrow files"
    kind = "an Arrow" if bad.suffix == ".arrow" else "a parquet"
    if path.is_dir() and _is_saved_to_disk(path):
        return (
            f"data.path '{path}' (a save_to_disk folder) cannot be read: its file {bad} is truncated or damaged "
            f"({reason}); write the folder again with save_to_disk"
        )
    where = f"data.path '{path}'" if bad == path else f"data.path '{path}': the file {bad}"
    return (
        f"{where} cannot be read ({reason}); it is truncated or not {kind} file: replace it with a whole "
        f"copy{'' if bad == path else ' or remove it'}"
    )


def _load(source: HFSource, download: bool) -> tuple[Any, str]:
    """The data set of ``source`` and where it was read from (for messages and the fingerprint)."""
    if not source.path:
        raise ConfigError("data.path", source.path, "a hub id (org/name) or a local path when data.name is 'hf'")
    local = Path(source.path).expanduser()
    if local.exists():
        if source.revision is not None:
            raise ConfigError(
                "data.revision",
                source.revision,
                f"null for the local path '{source.path}' (a revision "
                f"picks a snapshot of a hub id; a folder or file on disk is one version)",
            )
        return _load_local(local, download, source.cache_dir), str(local.resolve())
    from fl_lightning.models.hub import looks_like_hub_id

    if not looks_like_hub_id(source.path):
        raise MissingResourceError(
            f"data.path '{source.path}' does not exist: there is no such local file or folder "
            f"({local.resolve()}); give a hub id (org/name), a folder written by save_to_disk, "
            f"or .parquet / .arrow files"
        )
    folder = hub_folder(source.path, download=download, revision=source.revision, cache_dir=source.cache_dir)
    return _load_local(Path(folder), download, source.cache_dir), folder


def hub_folder(path: str, *, download: bool, revision: str | None = None, cache_dir: str | None = None) -> str:
    """The snapshot folder of the hub id ``path`` (``data.path``) in the hub cache, fetched first when ``download``.

    Args:
        path: a hub id (``org/name``, optionally ``@revision``) that is no local path.
        download: allow fetching it (``data.download``).
        revision: ``data.revision``.
        cache_dir: ``data.cache_dir`` (None: the environment's hub cache).

    Raises:
        MissingResourceError: :func:`~fl_lightning.models.hub.hub_snapshot`'s one line, which adds that no local
            folder of that name exists either (when ``path`` holds a separator) and which variable keeps
            huggingface_hub offline (when one does).
    """
    from fl_lightning.models.hub import hub_snapshot

    try:
        return hub_snapshot(
            path,
            repo_type="dataset",
            download=download,
            key="data.path",
            download_key="data.download",
            revision=revision,
            cache_dir=None if cache_dir is None else os.path.expanduser(cache_dir),
        )
    except MissingResourceError as err:
        raise MissingResourceError(str(err) + _not_found_notes(path, download)) from None


def _not_found_notes(path: str, download: bool) -> str:
    """What the line of a hub id missing from the cache adds: that no local folder of that name exists either (when
    ``path`` looks like a path: it holds a separator), and the variable that keeps huggingface_hub offline."""
    notes = ""
    if any(sep and sep in path for sep in (os.sep, os.altsep)):
        notes += f"; nor is it a local folder: no such local folder {Path(path).expanduser().resolve()}"
    offline = _offline_variable()
    if offline:
        notes += (
            f"; {offline}={os.environ.get(offline, '1')} is set, so huggingface_hub makes no request"
            f"{'' if download else ' even with data.download: true'}: unset it to download"
        )
    return notes


def _offline_variable() -> str | None:
    """The environment variable that put huggingface_hub in offline mode (read when it was imported), else None."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        return None
    if os.environ.get("TRANSFORMERS_OFFLINE") and not os.environ.get("HF_HUB_OFFLINE"):
        return "TRANSFORMERS_OFFLINE"
    return "HF_HUB_OFFLINE"


def _split(data: Any, name: str, key: str) -> Any:
    """The split ``name`` of ``data``, or the slice ``name`` says in datasets' split syntax (``train[:10%]``,
    ``train[1000:2000]``, ``train[:90%]+validation``): the rows ``load_dataset(..., split=name)`` gives, in order
    (``ReadInstruction``, its rounding of percentages included)."""
    import datasets

    if any(c in name for c in "[+"):
        return _sliced(data, name, key)
    if isinstance(data, datasets.Dataset):  # one table (a single file, or save_to_disk of a Dataset)
        if name == "train":
            return data
        raise ConfigError(key, name, "'train' (the data set has one split) or null")
    if name not in data:
        raise ConfigError(key, name, f"one of the data set's splits {sorted(data)}")
    return data[name]


def _sliced(data: Any, spec: str, key: str) -> Any:
    """:func:`_split` for a slice: each named split through :func:`_split`, then its absolute rows."""
    import datasets

    tables = {"train": data} if isinstance(data, datasets.Dataset) else dict(data)
    try:
        parts = datasets.ReadInstruction.from_spec(spec).to_absolute({n: len(t) for n, t in tables.items()})
    except (ValueError, AssertionError) as err:  # a bad spec, or a split the data set does not have
        raise ConfigError(
            key,
            spec,
            f"a split's name or a slice such as 'train[:10%]' or 'train[100:]+validation' ({' '.join(str(err).split())})",
        ) from None
    pieces = [tables[p.splitname].select(range(p.from_, p.to)) for p in parts]
    if not sum(len(p) for p in pieces):
        raise ConfigError(key, spec, "a slice that holds rows (this one is empty)")
    return pieces[0] if len(pieces) == 1 else datasets.concatenate_datasets(pieces)


def _columns_line(table: Any) -> str:
    return ", ".join(f"{n} ({type(f).__name__})" for n, f in table.features.items())


def _given_column(table: Any, given: str, key: str) -> str:
    """``given``, a column of ``table`` (else the one line listing the columns)."""
    if given not in table.features:
        raise UsageError(f"config error: {key}={given!r} is not a column of the data set; its columns: {_columns_line(table)}")
    return given


def _find_image_column(table: Any, given: str | None, where: str) -> str:
    """``given``, or the first ``Image`` feature, else the first column named as in :data:`_IMAGE_NAMES`; a column of
    plain values (strings, numbers) is refused in one line, whichever way it was found."""
    import datasets

    if given is not None:
        column = _given_column(table, given, "data.image_column")
    else:
        found = [n for n, f in table.features.items() if isinstance(f, datasets.Image)]
        found += [n for n in _IMAGE_NAMES if n in table.features]
        if not found:
            raise UsageError(
                f"cannot tell which column holds the images; set data.image_column to one of the data "
                f"set's columns: {_columns_line(table)}"
            )
        column = found[0]
    feature = table.features[column]
    if isinstance(feature, datasets.Value):  # decoding it would fail at the first item read, in a worker
        strings = feature.dtype in ("string", "large_string")
        held = (
            "strings, not images (file paths? cast the column to datasets.Image() before saving)"
            if strings
            else f"{feature.dtype} values, not images"
        )
        raise UsageError(
            f"column {column!r} of '{where}' holds {held}; set data.image_column to an Image column; "
            f"its columns: {_columns_line(table)}"
        )
    return column


def _find_label_column(table: Any, given: str | None) -> str:
    """``given``, else the one column that can hold the labels.

    The candidates are the ``ClassLabel`` features and the integer or string columns named ``label`` / ``labels``;
    one candidate is taken, and among several the one so named (if exactly one is). With no candidate, the first
    integer or string column named as in :data:`_FALLBACK_LABELS` is taken.

    Raises:
        UsageError: several candidates and no single ``label`` / ``labels`` among them, or none at all (one line
            listing them, or the columns, and saying to set ``data.label_column``).
    """
    import datasets

    if given is not None:
        return _given_column(table, given, "data.label_column")
    features = table.features
    preferred = [
        n
        for n in _PREFERRED_LABELS
        if n in features and (isinstance(features[n], datasets.ClassLabel) or _is_label_value(features[n]))
    ]
    candidates = [n for n, f in features.items() if isinstance(f, datasets.ClassLabel) or n in preferred]
    if len(candidates) == 1:
        return candidates[0]
    if len(preferred) == 1:  # several, one of them named label / labels: a domain, a writer … is no label
        return preferred[0]
    if candidates:
        listed = ", ".join(f"{n} ({type(features[n]).__name__})" for n in candidates)
        raise UsageError(
            f"cannot tell which column holds the labels: {len(candidates)} columns could ({listed}); "
            f"set data.label_column to one of them"
        )
    for name in _FALLBACK_LABELS:
        if name in features and _is_label_value(features[name]):
            return name
    raise UsageError(
        f"cannot tell which column holds the labels; set data.label_column to one of the data set's "
        f"columns: {_columns_line(table)}"
    )


def _is_label_value(feature: Any) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and (
        feature.dtype.startswith(("int", "uint")) or feature.dtype in ("string", "large_string")
    )


def column_values(table: Any, name: str) -> np.ndarray:
    """(N,) values of one column, read from Arrow without decoding any other column."""
    if getattr(table, "_indices", None) is not None:  # a select()/shuffle() view: materialise its row order
        table = table.flatten_indices()
    return np.asarray(table.data.column(name).to_numpy(zero_copy_only=False))


def _labels(train: Any, test: Any | None, column: str) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """The class names and the int64 targets of both splits (one mapping for both)."""
    import datasets

    feature = train.features[column]
    raw_train = column_values(train, column)
    raw_test = None if test is None else column_values(test, column)
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), raw_train.astype(np.int64), None if raw_test is None else raw_test.astype(np.int64)
    if not _is_label_value(feature):
        raise UsageError(
            f"column {column!r} holds {feature}, not class labels (integers, strings or a ClassLabel); "
            f"set data.label_column to one of: {_columns_line(train)}"
        )
    values = np.unique(raw_train)  # sorted: integers numerically, strings lexically
    classes = [str(v) for v in values.tolist()]
    train_targets = np.searchsorted(values, raw_train).astype(np.int64)
    if raw_test is None:
        return classes, train_targets, None
    unseen = np.setdiff1d(np.unique(raw_test), values)
    if unseen.size:
        raise UsageError(
            f"the test split's column {column!r} holds labels the training split lacks "
            f"({', '.join(map(str, unseen[:3].tolist()))}); every test label must occur in training"
        )
    return classes, train_targets, np.searchsorted(values, raw_test).astype(np.int64)


class HFImages(Dataset):
    """Rows ``rows`` of a ``datasets`` table as ``(image, target)``: the image decoded when read, in RGB, through
    ``transform``. A module-level class: it pickles into DataLoader workers (the table is memory-mapped)."""

    def __init__(
        self, *, table: Any, image_column: str, rows: np.ndarray | None, targets: np.ndarray, transform: Any, where: str
    ) -> None:
        self.table = table.select_columns([image_column])  # reading a row decodes this column only
        self.image_column, self.rows, self.targets = image_column, rows, targets
        self.transform, self.where = transform, where

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        row = int(index if self.rows is None else self.rows[index])
        try:
            image = self.table[row][self.image_column]
            image = image.convert("RGB") if hasattr(image, "convert") else image
        except IMAGE_ERRORS as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            raise CorruptImageError(
                f"row {row} of '{self.where}' (column {self.image_column!r}) cannot be decoded ({reason}); remove or replace it"
            ) from err
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])


@dataclass(frozen=True)
class _ColumnReader:
    """A training split's column by name, in the split's row order (for ``partition.scheme: natural``).

    Raises:
        UsageError: ``name`` is no column, a column of images (or other non-scalar values), or has a null in a
            training row (one line each). A column with one distinct value is a warning: one client, trained centrally.
    """

    table: Any
    rows: np.ndarray | None

    def __call__(self, name: str) -> np.ndarray:
        import datasets

        feature = self.table.features.get(name)
        if feature is None:
            raise UsageError(
                f"config error: partition.by={name!r} is not a column of the data set; its columns: {_columns_line(self.table)}"
            )
        if not isinstance(feature, (datasets.Value, datasets.ClassLabel)):
            raise UsageError(
                f"config error: partition.by={name!r} is a column of {type(feature).__name__} values, not "
                f"of ids; name a column of integers or strings (a writer, a user); its columns: "
                f"{_columns_line(self.table)}"
            )
        values = column_values(self.table, name)
        values = values if self.rows is None else values[self.rows]
        _check_ids(values, name, self.rows)
        return values


def _missing(values: np.ndarray) -> np.ndarray:
    """(N,) bool: where a column read from Arrow had a null (None among objects, NaN among floats)."""
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "O":
        return np.fromiter((v is None for v in values), bool, len(values))
    return np.zeros(len(values), bool)


def _check_ids(values: np.ndarray, name: str, rows: np.ndarray | None) -> None:
    """Natural ids: none missing (one line naming the first row without one); a warning when there is one id only."""
    missing = _missing(values)
    if missing.any():
        first = int(np.flatnonzero(missing)[0])
        row = first if rows is None else int(rows[first])
        raise UsageError(
            f"partition.by={name!r} has no value (null) in {int(missing.sum())} of the {len(values)} "
            f"training rows (the first: row {row}); a natural client needs an id in every row: fill "
            f"or drop those rows, or name another column"
        )
    distinct = np.unique(values)
    if distinct.size == 1:
        warnings.warn(
            f"partition.by={name!r} holds one value ({distinct[0]!r}) in all {len(values)} training rows: "
            f"the natural partition has one client, so the run trains centrally",
            stacklevel=3,
        )


def build_hf_dataset(
    source: HFSource, *, download: bool, train_transform: Any, test_transform: Any, seed: int, num_samples: int | None
) -> Any:
    """The :class:`~fl_lightning.data.registry.DatasetSplits` of a Hugging Face data set.

    Args:
        source: where the data set is and which splits and columns to read.
        download: allow fetching a hub id missing from the cache (``data.download``).
        train_transform, test_transform: applied to each decoded RGB image.
        seed: the seed of the 4:1 split (``test_split: null``) and of the ``num_samples`` subset.
        num_samples: keep a seeded random subset of this many training rows.

    Raises:
        ConfigError / UsageError: a missing split or column (one line listing what there is).
        MissingResourceError: a hub id that is not in the cache (and downloading is off).
    """
    try:
        import datasets  # noqa: F401 — an optional dependency (the extra 'hf')
    except ImportError:
        raise MissingResourceError(
            "data.name: hf reads data with the Hugging Face datasets library, which is not "
            "installed: pip install 'fl_lightning[hf]' (or 'datasets>=5.2')"
        ) from None
    data, where = _load(source, download)
    train_table = _split(data, source.train_split, "data.train_split")
    test_table = None if source.test_split is None else _split(data, source.test_split, "data.test_split")
    image_column = _find_image_column(train_table, source.image_column, where)
    label_column = _find_label_column(train_table, source.label_column)
    if test_table is not None:
        for column in (image_column, label_column):
            if column not in test_table.features:
                raise UsageError(
                    f"the test split {source.test_split!r} has no column {column!r}; its columns: {_columns_line(test_table)}"
                )
    classes, train_targets, test_targets = _labels(train_table, test_table, label_column)
    if len(classes) < 2:
        raise UsageError(
            f"column {label_column!r} of '{where}' holds {len(classes)} class; a classification run needs at least 2"
        )
    train_rows = test_rows = None
    if test_table is None:  # one table: a seeded, stratified 4:1 split, as for imagefolder
        train_rows, test_rows = split_4_to_1(train_targets, seed)
        test_table, test_targets = train_table, train_targets[test_rows]
        train_targets = train_targets[train_rows]
    identity = {
        "where": where,
        "train": [source.train_split, train_table._fingerprint],
        "test": [source.test_split, test_table._fingerprint],
        "image": image_column,
        "label": label_column,
    }
    if source.revision is not None:  # absent at main: the fingerprints (and feature caches) made before it stay valid
        identity["revision"] = source.revision
    fingerprint = hashlib.sha256(json.dumps(identity).encode()).hexdigest()
    splits = DatasetSplits(
        HFImages(
            table=train_table,
            image_column=image_column,
            rows=train_rows,
            targets=train_targets,
            transform=train_transform,
            where=where,
        ),
        HFImages(
            table=test_table,
            image_column=image_column,
            rows=test_rows,
            targets=test_targets,
            transform=test_transform,
            where=where,
        ),
        classes,
        train_targets,
        test_targets,
        fingerprint=fingerprint,
        train_column=_ColumnReader(train_table, train_rows),
    )
    return limit_train(splits, num_samples, seed)
