"""The data path alone: images/s of the paper configs' pipeline against what a GPU's training step eats.

``python -m benchmarks loader`` reads the paper configs (``conf/fedopal_*.yaml``, ``conf/fedisyn_*.yaml`` whose
model is the CLIP ViT-B/16, 224 px) and times, for each kind of source image they read — CIFAR-sized
(32×32, as CIFAR-10/100 and SVHN hold them in memory) and Food-101-sized (a 512×384 JPEG decoded per item, as
Food-101, DTD and Caltech-101 are read) — a DataLoader over generated images with the registry's CLIP
transform (``build_transform(normalization="clip", image_size=224)``), batches of 64, per worker count (0, 1, 2)
and per path:

* ``float32``: the transform per item, every pass (today's path for a 224-px split: its float32 tensors exceed
  ``data.cache_mb``);
* ``uint8``: the uint8 store of ``data.cache_uint8_mb`` once filled (a later pass): a gather of uint8 images and
  the float part (``ToDtype``, clamp, ``Normalize``) on each batch in ``collate``. Its first pass costs what the
  float32 path does;
* ``uint8_cold``: a cold uint8 store's first pass, primed in the rank and filled by the workers in shared memory
  (``data/preprocessed.py``): its images/s (the decode-bound pass) and how many items the rank holds after it;
* ``uint8_device``: the same store with ``data.normalize_on_device`` (the default on CUDA): the loader hands on
  the gathered uint8 batch and the float part runs on the GPU after the copy (elementwise, ~0.6 MB a 224-px image
  written: microseconds on a GPU, not timed here), so a loading process only gathers rows.

and FeDiSyn's pre-training input (``synthetic_*``): generated 512-px PNGs through the imagenet 224-px transforms,
decoded per item (``png_*``) against the synthetic store (``synthesis/store.py``: ``store_exact_train``,
``store_val``, ``store_input_train``, the float part in the loader) and the store's one-off build.

Against it, by arithmetic (no GPU needed; the assumptions are printed with the figures): a bf16 training step
needs ``3 × forward FLOPs`` per image — forward ≈ 17.6 GFLOP for ViT-B/16 at 224 px, 61.6 GFLOP for ViT-L/16 —
on an H100 at 989 TFLOP/s dense bf16 and an assumed 40 % utilisation; the workers per GPU needed are that rate
over the measured images/s of one loading process (0 workers: the rank's own). On a shared 2-core machine the
1- and 2-worker figures are bounded by the cores there are.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader, Dataset

from benchmarks._timing import figure

__all__ = [
    "run",
    "paper_configs",
    "required_images_per_s",
    "device_images_per_s",
    "H100_BF16_FLOPS",
    "UTILISATION",
    "FORWARD_GFLOP",
]

_REPO = Path(__file__).resolve().parents[1]
H100_BF16_FLOPS = 989e12  # H100 SXM dense bf16 peak
UTILISATION = 0.40  # assumed model FLOPs utilisation of a training step
FORWARD_GFLOP = {"vit_b16": 17.6, "vit_l16": 61.6}  # one 224-px image's forward pass
# the data sets of the paper configs, by the size of the image a split reads
SOURCES = {
    "cifar10": "cifar",
    "cifar100": "cifar",
    "svhn": "cifar",
    "food101": "food101",
    "dtd": "food101",
    "caltech101": "food101",
}


def required_images_per_s(forward_gflop: float, *, flops: float = H100_BF16_FLOPS, utilisation: float = UTILISATION) -> float:
    """Images/s a bf16 training step consumes: ``flops × utilisation / (3 × forward FLOPs)`` (forward + the
    backward's two matmuls per forward one)."""
    return flops * utilisation / (3.0 * forward_gflop * 1e9)


def paper_configs() -> dict[str, list[str]]:
    """``{source kind: [config file, ...]}`` of the paper configs whose model is CLIP ViT-B-16 at 224 px."""
    out: dict[str, list[str]] = {}
    for path in sorted([*(_REPO / "conf").glob("fedopal_*.yaml"), *(_REPO / "conf").glob("fedisyn_*.yaml")]):
        cfg = yaml.safe_load(path.read_text()) or {}
        data, model = cfg.get("data") or {}, cfg.get("model") or {}
        kind = SOURCES.get(data.get("name"))
        if kind and model.get("name") == "ViT-B-16" and data.get("image_size") in (None, 224):
            out.setdefault(kind, []).append(path.name)
    return out


class _Generated(Dataset):
    """Generated source images read as the registry reads them: CIFAR-sized PIL images held in memory, or
    Food-101-sized JPEG bytes decoded per item; ``transform`` on each (the attribute the uint8 store splits)."""

    def __init__(self, kind: str, n: int, transform: Any) -> None:
        from PIL import Image

        rng = np.random.default_rng(0)
        self.kind, self.transform = kind, transform
        if kind == "cifar":
            self.items = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
        else:
            smooth = [
                np.kron(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8)) for _ in range(min(n, 8))
            ]  # blocky 384×512 photos: a JPEG's size, not noise's
            self.items = []
            for i in range(n):
                buf = io.BytesIO()
                Image.fromarray(smooth[i % len(smooth)]).save(buf, format="JPEG", quality=90)
                self.items.append(buf.getvalue())

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        item = self.items[i]
        image = item if self.kind == "cifar" else Image.open(io.BytesIO(item)).convert("RGB")
        return self.transform(image), i % 10


def _images_per_s(dataset: Dataset, workers: int, *, batch_size: int, passes: int, float_part: bool = True) -> float:
    from fl_lightning.data.preprocessed import collate, collate_uint8

    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=collate if float_part else collate_uint8,
    )
    for _ in loader:  # warm-up: the workers start, a store is filled (not timed)
        break
    best = math.inf
    for _ in range(passes):
        start = time.perf_counter()
        n = sum(len(b[1]) for b in loader)
        best = min(best, time.perf_counter() - start)
    return n / best


def _cold_fill(split: Dataset, workers: int) -> tuple[float, int]:
    """A cold uint8 store's first pass as a run makes it (primed in the rank, ``workers`` processes filling it):
    its images/s and how many items the rank's store holds after it (all of them when the workers share it)."""
    from fl_lightning.data.preprocessed import PreprocessedSplit, collate

    store = PreprocessedSplit(split, budget_bytes=0, uint8_budget_bytes=1 << 40)
    store.prime()
    start = time.perf_counter()
    n = sum(len(b[1]) for b in DataLoader(store, batch_size=64, num_workers=workers, collate_fn=collate))
    return n / (time.perf_counter() - start), store.stored


def device_images_per_s(
    device: torch.device | str, *, workers: int, images: int = 512, kind: str = "food101", passes: int = 2
) -> float:
    """Images/s delivered ON ``device``, float32 and normalised, by the uint8 store's loader with ``workers`` processes
    as a run reads it (``data.normalize_on_device``: uint8 batches, pinned on CUDA, copied, the float part on the
    device); the store filled first (a later pass), the device synchronised before the clock stops."""
    from fl_lightning.data.loader import DeviceFloatPart
    from fl_lightning.data.preprocessed import PreprocessedSplit, collate_uint8
    from fl_lightning.data.transforms import CLIP_MEAN, CLIP_STD, build_transform

    device = torch.device(device)
    transform = build_transform(normalization="clip", image_size=224, train=False, mean=CLIP_MEAN, std=CLIP_STD)
    cached = PreprocessedSplit(_Generated(kind, images, transform), budget_bytes=0, uint8_budget_bytes=1 << 40)
    for i in range(images):
        cached[i]
    loader = DeviceFloatPart(
        DataLoader(
            cached,
            batch_size=64,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=device.type == "cuda",
            collate_fn=collate_uint8,
        ),
        device=device,
        float_part=cached.float_part,
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in loader:  # warm-up: the workers start
        break
    best = math.inf
    for _ in range(passes):
        start = time.perf_counter()
        n = 0
        for x, _ in loader:
            n += len(x)
        sync()
        best = min(best, time.perf_counter() - start)
    return n / best


class _Pngs(Dataset):
    """The synthetic folder read as pre-training reads it without a store: a PNG decoded per item."""

    def __init__(self, folder: Path, transform: Any) -> None:
        from fl_lightning.synthesis.store import _manifest

        self.folder, self.transform, self.items = folder, transform, _manifest(folder)[1]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(self.folder / path) as img:
            image = img.convert("RGB")
        return self.transform(image), label


def _synthetic(n: int, measured: dict[str, dict[str, float]]) -> dict[str, Any]:
    """FeDiSyn's pre-training input: 512-px PNGs (smooth noise, about an SD image's PNG size) through the imagenet
    224-px transforms, per item from the PNGs vs from the store (``synthesis/store.py``), one loading process on one
    torch thread."""
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one loading process on one core, as the pre-training's loader runs (0 workers)
    try:
        _time_synthetic(n, rng, out, measured)
    finally:
        torch.set_num_threads(threads)
    return out


def _time_synthetic(n: int, rng: np.random.Generator, out: dict[str, Any], measured: dict[str, dict[str, float]]) -> None:
    import json
    import tempfile

    from PIL import Image

    from fl_lightning.data.transforms import build_transform
    from fl_lightning.synthesis.generate import MANIFEST_NAME
    from fl_lightning.synthesis.store import stored_splits

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows, png_bytes = [], 0
        for i in range(n):
            low = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).resize((512, 512), Image.BICUBIC)
            noisy = np.clip(np.asarray(low, np.int16) + rng.integers(-6, 7, (512, 512, 3)), 0, 255).astype(np.uint8)
            rel = f"c{i % 10}/{i:05d}.png"
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(noisy).save(folder / rel)
            png_bytes += (folder / rel).stat().st_size
            rows.append(json.dumps({"path": rel, "label": i % 10}) + "\n")
        (folder / MANIFEST_NAME).write_text("".join(rows), encoding="utf-8")
        spec = dict(normalization="imagenet", image_size=224, mean=(0.5,) * 3, std=(0.5,) * 3)
        train_tf, val_tf = build_transform(**spec, train=True), build_transform(**spec, train=False)
        start = time.perf_counter()
        exact = stored_splits(folder, train_tf, val_tf, mode="exact")
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        near = stored_splits(folder, train_tf, val_tf, mode="input")
        assert exact is not None and near is not None
        note = f"{n} 512-px PNGs ({png_bytes / n / 1024:.0f} KiB each) -> imagenet 224 px, 0 workers"
        for path, data in (
            ("png_train", _Pngs(folder, train_tf)),
            ("png_val", _Pngs(folder, val_tf)),
            ("store_exact_train", exact[0]),
            ("store_val", exact[1]),
            ("store_input_train", near[0]),
        ):
            rate = _images_per_s(data, 0, batch_size=64, passes=5)  # the best of 5: a shared machine varies
            measured[f"synthetic_{path}"] = {"images_per_s": rate}
            out[f"synthetic_{path}_images_per_s"] = figure(rate, "img/s", note=note)
        out["synthetic_store_build_images_per_s"] = figure(n / build_s, "img/s", note="decode + both heads, written once (exact)")


def run(
    *, quick: bool, device: torch.device | None = None, workers: Sequence[int] = (0, 1, 2), images: int | None = None
) -> dict[str, Any]:
    """Every figure of the suite (see the module docstring); CPU processes whatever ``device``.

    Args:
        quick: 32 images of each kind and workers 0 and 1: checks the machinery in seconds.
        device: ignored (the data path runs on the CPU); accepted for the common runner signature.
        workers: the DataLoader worker counts.
        images: images per kind (default 512; quick 32).
    """
    from fl_lightning.data.preprocessed import PreprocessedSplit
    from fl_lightning.data.transforms import CLIP_MEAN, CLIP_STD, build_transform

    n = images or (32 if quick else 512)
    counts = [w for w in workers if not quick or w <= 1]
    transform = build_transform(normalization="clip", image_size=224, train=False, mean=CLIP_MEAN, std=CLIP_STD)
    configs = paper_configs()
    results: dict[str, Any] = {}
    need = {name: required_images_per_s(g) for name, g in FORWARD_GFLOP.items()}
    assumptions = (
        f"H100 bf16 {H100_BF16_FLOPS / 1e12:.0f} TFLOP/s dense at {UTILISATION:.0%} utilisation; 3 x forward FLOPs per image"
    )
    for name, rate in need.items():
        results[f"required_{name}_images_per_s"] = figure(
            rate, "img/s", note=f"{name} bf16 step: forward {FORWARD_GFLOP[name]} GFLOP at 224 px; {assumptions}"
        )
    measured: dict[str, dict[str, float]] = {}
    for kind in ("cifar", "food101"):
        split = _Generated(kind, n, transform)
        cached = PreprocessedSplit(_Generated(kind, n, transform), budget_bytes=0, uint8_budget_bytes=1 << 40)
        for i in range(n):  # fill the uint8 store in this process, before any worker starts (they share it)
            cached[i]
        assert cached.stored_dtype == torch.uint8, "the CLIP pipeline's uint8 store did not engage"
        for path, data in (("float32", split), ("uint8", cached), ("uint8_device", cached)):
            for w in counts:
                rate = _images_per_s(data, w, batch_size=64, passes=1 if quick else 2, float_part=path != "uint8_device")
                measured[f"{kind}_{path}_w{w}"] = {"images_per_s": rate}
                note = f"{kind}-sized images, {', '.join(configs.get(kind, [])) or 'no paper config'}"
                results[f"{kind}_{path}_workers{w}_images_per_s"] = figure(rate, "img/s", note=note)
        for w in counts:
            rate, stored = _cold_fill(_Generated(kind, n, transform), w)
            measured[f"{kind}_uint8_cold_w{w}"] = {"images_per_s": rate, "stored_after_first_pass": stored}
            results[f"{kind}_uint8_cold_workers{w}_images_per_s"] = figure(
                rate, "img/s", note=f"{kind}-sized: a cold uint8 store's first pass, {w} workers filling it"
            )
            results[f"{kind}_uint8_cold_workers{w}_stored"] = figure(
                stored,
                "items",
                op=">=",
                bound=n,
                note="held by the rank after the first pass: the workers filled "
                "its one store (shared memory), not copies of their own",
            )
        for path in ("float32", "uint8", "uint8_device"):
            per_process = measured[f"{kind}_{path}_w0"]["images_per_s"]  # one loading process, no IPC
            for name, rate in need.items():
                results[f"{kind}_{path}_workers_for_{name}"] = figure(
                    math.ceil(rate / per_process),
                    "workers",
                    note=f"per H100 for {name}: {rate:.0f} img/s over {per_process:.0f} img/s per loading process",
                )
    results.update(_synthetic(min(n, 16 if quick else 64), measured))
    results["sizes"] = {
        "images": n,
        "workers": counts,
        "batch_size": 64,
        "image_size": 224,
        "configs": configs,
        "bytes_per_image": {"float32": 3 * 224 * 224 * 4, "uint8": 3 * 224 * 224},
        "assumptions": assumptions,
        "measured": measured,
    }
    return results
