"""The synthetic images' read store (fl_lightning/synthesis/store.py): the PNG path's items, bit for bit; reused only
when it holds what its record says (else built again, one warning); a full disk while it is made is one line."""

import errno
import hashlib
import json
import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fl_lightning.algorithms.synthetic_family.synthesis_step import SyntheticFolder
from fl_lightning.data.preprocessed import collate
from fl_lightning.data.transforms import build_transform
from fl_lightning.errors import DiskFullError
from fl_lightning.federation.storage import checkpoint as checkpoint_module
from fl_lightning.modules.pretraining import split_holdout
from fl_lightning.synthesis.generate import MANIFEST_NAME
from fl_lightning.synthesis.store import (
    STORE_DIR,
    array_digest,
    build_stores,
    remove_stores,
    split_transform,
    store_key,
    stored_splits,
)
from tests.modules.tiny_vit import TINY, pretrain_tiny

MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def _folder(root, n=12, side=40, classes=3, seed=0):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = i % classes
        rel = f"c{label}/{i:05d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, size=(side // 4, side // 4, 3), dtype=np.uint8)  # smooth-ish: resizes matter
        Image.fromarray(base).resize((side, side), Image.BICUBIC).save(root / rel)
        rows.append({"path": rel, "class": f"c{label}", "label": label})
    (root / MANIFEST_NAME).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def _transforms(size, **kw):
    spec = dict(normalization="imagenet", image_size=size, mean=MEAN, std=STD, **kw)
    return build_transform(**spec, train=True), build_transform(**spec, train=False)


def _items(dataset, n, seed):
    torch.manual_seed(seed)  # the random steps draw from torch's global stream, item after item
    return [dataset[i] for i in range(n)]


@pytest.mark.parametrize(("size", "kw"), [(32, {}), (16, {}), (24, {"augmentation": "crop_flip"})])
def test_store_items_equal_the_png_items_bit_for_bit(tmp_path, size, kw):
    folder = _folder(tmp_path)
    train_tf, val_tf = _transforms(size, **kw)
    stored = stored_splits(folder, train_tf, val_tf, mode="exact")
    assert stored is not None
    for png, store in zip((SyntheticFolder(folder, train_tf), SyntheticFolder(folder, val_tf)), stored):
        for (a, ya), (b, yb) in zip(_items(png, len(png), 7), _items(store, len(store), 7)):
            assert ya == yb and a.dtype == b.dtype == torch.float32 and torch.equal(a, b)


def test_store_batches_equal_the_png_batches_through_the_loader(tmp_path):
    """Shuffled batches of a held-out split (pretrain_classifier's loaders): the float part on the whole batch."""
    folder = _folder(tmp_path, n=20)
    train_tf, val_tf = _transforms(32)
    stored = stored_splits(folder, train_tf, val_tf)
    for png, store in zip((SyntheticFolder(folder, train_tf), SyntheticFolder(folder, val_tf)), stored):
        sides = [split_holdout(d, 0.25, 0)[0] for d in (png, store)]
        loaders = [
            DataLoader(s, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(3), collate_fn=collate)
            for s in sides
        ]
        torch.manual_seed(11)
        a = [b for b in loaders[0]]
        torch.manual_seed(11)
        b = [b for b in loaders[1]]
        assert len(a) == len(b) == 3
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and ya.dtype == yb.dtype == torch.int64


def test_the_store_is_at_the_input_size_where_the_transform_allows(tmp_path):
    folder = _folder(tmp_path, side=40)
    train_tf, val_tf = _transforms(32)  # imagenet at >= 32 px: RandomResizedCrop on the decoded image
    train, val = stored_splits(folder, train_tf, val_tf)
    assert train.images.shape == (12, 3, 40, 40) and train.images.dtype == np.uint8  # the generated size
    assert val.images.shape == (12, 3, 32, 32)  # the held-out transform's Resize + CenterCrop
    assert split_transform(val_tf).middle.transforms[0].__class__.__name__ == "Identity"
    train, val = stored_splits(folder, *_transforms(16))  # < 32 px: no augmentation, one store for both
    assert train.path == val.path and train.images.shape == (12, 3, 16, 16)


def test_a_changed_folder_or_size_makes_another_store_and_the_old_one_goes(tmp_path):
    folder = _folder(tmp_path)
    head = split_transform(_transforms(16)[1]).head
    first = build_stores(folder, [head])[0]
    assert first.is_file() and first.parent == folder / STORE_DIR
    assert build_stores(folder, [head]) == [first]  # present: not built again
    mtime = first.stat().st_mtime_ns
    assert build_stores(folder, [head])[0].stat().st_mtime_ns == mtime
    other = split_transform(_transforms(24)[1]).head
    assert store_key(folder, other) != store_key(folder, head)
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(folder / "c0/00000.png")  # an image regenerated
    os.utime(folder / "c0/00000.png", ns=(1, 1))
    second = build_stores(folder, [head])[0]
    assert second != first and not first.exists()
    assert sorted((folder / STORE_DIR).iterdir()) == [second.with_suffix(".json"), second]  # the store, its record
    assert not np.load(second, mmap_mode="r")[0].any()
    remove_stores(folder)
    assert not (folder / STORE_DIR).exists() and (folder / MANIFEST_NAME).is_file()


def _damage_truncate(store):
    with open(store, "r+b") as f:
        f.truncate(store.stat().st_size // 2)  # a copy cut short: np.load's "mmap length is greater than file size"


def _damage_pixels(store):
    array = np.load(store, mmap_mode="r+")
    array[3] = 255 - array[3]  # other pixels of the right shape
    array.flush()


def _damage_shape(store):
    np.save(store, np.zeros((5, 3, 16, 16), np.uint8))  # another folder's store under this key


def _damage_record(store):
    store.with_suffix(".json").unlink()  # a store from before the record, or a kill between the two files


@pytest.mark.parametrize(
    "damage",
    [_damage_truncate, _damage_pixels, _damage_shape, _damage_record],
    ids=["truncated", "other-pixels", "other-shape", "no-record"],
)
def test_a_store_unfit_for_reuse_is_built_again_with_one_warning(tmp_path, damage):
    folder = _folder(tmp_path)
    head = split_transform(_transforms(16)[1]).head
    store = build_stores(folder, [head])[0]
    good = np.load(store).copy()
    damage(store)
    with pytest.warns(UserWarning, match=rf"store '{store}' is built again: ") as seen:
        assert build_stores(folder, [head]) == [store]
    assert len(seen) == 1 and "\n" not in str(seen[0].message)
    assert np.array_equal(np.load(store), good)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # whole again: reused without a word
        assert build_stores(folder, [head]) == [store]


def test_the_record_holds_the_stores_shape_and_sha256(tmp_path):
    folder = _folder(tmp_path)
    store = build_stores(folder, [split_transform(_transforms(16)[1]).head])[0]
    record = json.loads(store.with_suffix(".json").read_text())
    array = np.load(store)
    assert record == {"shape": [12, 3, 16, 16], "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    chunked = array_digest(np.load(store, mmap_mode="r"))
    assert chunked == record["sha256"]


def test_a_full_disk_while_a_store_is_made_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    folder = _folder(tmp_path)

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module.os, "posix_fallocate", no_room)
    with pytest.raises(DiskFullError, match=r"\.store/.*\.npy.*tmp.*needs") as err:
        build_stores(folder, [split_transform(_transforms(16)[1]).head])
    assert "\n" not in str(err.value)
    assert not [p for p in (folder / STORE_DIR).iterdir()]  # no half store, no temp file


def test_a_real_full_disk_while_a_store_is_made_is_one_line_not_a_sigbus(tiny_disk):
    """Before the blocks were reserved, the map's first page past the free space killed the process (SIGBUS)."""
    folder = _folder(tiny_disk / "synthetic")  # 12 PNGs of 40 px fit; their 224-px store (1.8 MiB) does not
    with pytest.raises(DiskFullError, match=r"could not be written: it needs 1.7 MiB \(its size\)") as err:
        build_stores(folder, [split_transform(_transforms(224)[1]).head])
    assert "\n" not in str(err.value)
    assert not list((folder / STORE_DIR).iterdir())


def test_a_file_system_that_cannot_reserve_blocks_still_gets_its_store(tmp_path, monkeypatch):
    folder = _folder(tmp_path)

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(checkpoint_module.os, "posix_fallocate", unsupported)
    store = build_stores(folder, [split_transform(_transforms(16)[1]).head])[0]
    assert np.load(store).shape == (12, 3, 16, 16)


def test_a_pickled_store_maps_its_file_again(tmp_path):
    import pickle

    folder = _folder(tmp_path)
    train, _ = stored_splits(folder, *_transforms(16))
    assert train.images.shape == (12, 3, 16, 16)  # mapped here
    blob = pickle.dumps(train)
    assert len(blob) < 12 * 3 * 16 * 16  # not the array
    again = pickle.loads(blob)
    torch.manual_seed(0)
    a = again[3][0]
    torch.manual_seed(0)
    assert torch.equal(a, train[3][0])


def test_images_of_two_sizes_where_the_store_keeps_the_generated_size_are_read_from_the_pngs(tmp_path):
    folder = _folder(tmp_path, side=40)
    Image.fromarray(np.zeros((48, 48, 3), np.uint8)).save(folder / "c1/00001.png")
    with pytest.warns(UserWarning, match="read from their PNGs"):
        assert stored_splits(folder, *_transforms(32)) is None  # the training store would hold 40 and 48 px
    assert stored_splits(folder, *_transforms(16)) is not None  # both heads resize: one size
    assert not list((folder / STORE_DIR).glob("*.tmp"))


def test_off_reads_the_pngs_and_a_bad_mode_is_refused(tmp_path):
    folder = _folder(tmp_path)
    assert stored_splits(folder, *_transforms(16), mode="off") is None
    assert not (folder / STORE_DIR).exists()
    with pytest.raises(ValueError, match="mode"):
        stored_splits(folder, *_transforms(16), mode="fast")


def test_input_mode_one_store_at_the_input_size_the_crops_resampled_from_it(tmp_path):
    folder = _folder(tmp_path, side=64)
    train_tf, val_tf = _transforms(32)
    train, val = stored_splits(folder, train_tf, val_tf, mode="input")
    assert train.path == val.path and train.images.shape == (12, 3, 32, 32)
    png = SyntheticFolder(folder, val_tf)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(_items(png, 12, 0), _items(val, 12, 0)))
    png = SyntheticFolder(folder, train_tf)
    a = torch.stack([x for x, _ in _items(png, 12, 5)])
    b = torch.stack([x for x, _ in _items(train, 12, 5)])
    assert a.shape == b.shape and not torch.equal(a, b)  # the same draws, crops of a 32-px image instead of 64 px
    assert float((a - b).abs().mean()) < 0.5  # normalised units (std 0.5): about a tenth of the range at most


@pytest.mark.parametrize("defer", [False, True])  # True: uint8 batches, the float part in the module's batch hook
def test_pretraining_on_the_store_gives_the_png_weights(tmp_path, defer):
    folder = _folder(tmp_path / "images", n=24, side=40)
    train_tf, val_tf = _transforms(32)  # the training split's RandomResizedCrop and flip draw as on the PNGs
    tiny = dict(TINY, img_size=32)
    weights = []
    for name, (train_all, val_all) in {
        "png": (SyntheticFolder(folder, train_tf), SyntheticFolder(folder, val_tf)),
        "store": stored_splits(folder, train_tf, val_tf, defer=defer),
    }.items():
        train, _ = split_holdout(train_all, 0.25, 0)
        _, val = split_holdout(val_all, 0.25, 0)
        ckpt, _ = pretrain_tiny(
            train,
            val,
            tmp_path / name,
            overrides=tiny,
            max_epochs=2,
            batch_size=8,
            lr=3e-3,
            seed=0,
            patience=2,
            batch_transform=train_all.deferred if name == "store" else None,
        )
        weights.append(torch.load(ckpt, weights_only=True)["state_dict"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    if defer:
        assert train_all.deferred is not None and train_all[0][0].dtype == torch.uint8
