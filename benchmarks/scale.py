"""The engine at scale: one-shot AFL from 10 to 10,000 clients beside a bare PyTorch loop.

``python -m benchmarks scale`` runs the same job — AFL (one round, Eq. (7) statistics, the
Eq. (9) solve) with d=768 features (a random timm ViT, ``embed_dim 768, depth 1``) on a FIXED data set — at
K ∈ {10, 100, 1000, 10000} clients, and reports per K:

* ``overhead_per_client_s`` — (wall − bare) / K, where wall is the framework's run from the end of
  set-up to the end of the run (plan, clients, their records, gather, aggregate, evaluation,
  checkpoint) and bare is a hand-written PyTorch loop doing the same work (per-client DataLoader,
  per-client R_k, C_k, their sum, the solve, the test accuracy) with the same model and data;
* ``overhead_vs_compute_pct`` — 100 · (wall − bare) / bare;
* ``rss_rank0_ratio`` / ``rss_other_ranks_ratio`` — peak RSS of rank 0 and of rank 1 (2 processes) at
  the largest K over the smallest K at which the other figures are taken (K=100 in a full run),
  measured in fresh processes (``VmHWM``, reset at the start of the federation so that set-up does
  not hide growth; the peak since process start is in the details too);
* ``checkpoint_bytes_linearity`` — bytes written per client, max over min across K (1.0: exactly
  linear in K). Bytes are MEASURED, not derived: each rank's ``wchar`` (bytes passed to write(2),
  ``/proc/self/io``) from the start of the round to its end (the run's constant files — server.pt,
  metrics.csv, partition.png — come after), summed over ranks, plus the
  size of the round folder just before it is cleared.

Full size: 16 px synthetic images in one 16 px patch, so 10,000 images cost ~20 CPU-seconds and the
engine's cost is visible beside the model's. It also times the peer job (bundled digits, a tiny timm ViT,
Dirichlet α=0.5, K=20 and K=100) end to
end — ``python -m fl_lightning.train`` against a self-contained bare script (torch + timm + sklearn
only) — and the fast start: process start → first client, split into set-up phases.

The data set is ``synthetic`` with 10,000 training images for every K (bundled digits has 1,437
training images, and a partition needs K ≤ N). ``--quick`` runs a 64-d model on 400 images at
K ∈ {10, 100} (seconds; checks the machinery, not the thresholds).

Each measurement runs in a fresh process: ``python -m benchmarks.scale --worker ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._timing import bytes_written, figure, peak_rss_bytes, reset_peak_rss

__all__ = ["run", "scale_config", "peer_config", "SIZES"]

# full: the sizes of the cost contract (docs/architecture.md); quick: the same machinery in seconds
SIZES: dict[bool, dict[str, Any]] = {
    # 16 px images in one 16 px patch (+ CLS: 2 tokens): 10,000 images through a 768-wide block stay
    # ~20 CPU-seconds, so the engine's cost is not buried under the model's; the upload (d=768) is a ViT-B's
    False: {
        "dim": 768,
        "heads": 12,
        "image_size": 16,
        "patch_size": 16,
        "clients": (10, 100, 1000, 10000),
        "num_samples": 10_000,
        "two_process_clients": (10, 100, 1000, 10000),
        "peer_clients": (20, 100),
        "reference_clients": 100,
    },
    True: {
        "dim": 64,
        "heads": 4,
        "image_size": 32,
        "patch_size": 8,
        "clients": (10, 100),
        "num_samples": 400,
        "two_process_clients": (100,),
        "peer_clients": (20,),
        "reference_clients": 10,
    },
}
_REPO = Path(__file__).resolve().parents[1]


# -- the jobs -----------------------------------------------------------------------------------------
def scale_config(
    *,
    num_clients: int,
    dim: int,
    heads: int,
    num_samples: int,
    output_dir: str,
    devices: int = 1,
    image_size: int = 32,
    patch_size: int = 8,
) -> dict[str, Any]:
    """The scale job as a config mapping (the YAML's shape): AFL, a d-dim depth-1 timm ViT,
    ``num_samples`` synthetic images cut IID into ``num_clients`` parts (the total does not change with K)."""
    return {
        "algorithm": "afl",
        "seed": 0,
        "output_dir": output_dir,
        "run_name": f"scale_k{num_clients}",
        # the engine computes its features in every job, as the bare loop does (no feature cache across K)
        "data": {
            "name": "synthetic",
            "image_size": image_size,
            "batch_size": 64,
            "num_samples": num_samples,
            "feature_cache": False,
        },
        "partition": {"scheme": "iid", "num_clients": num_clients},
        "model": {
            "library": "timm",
            "name": "vit_base_patch16_224",
            "pretrained": None,
            "overrides": {"img_size": image_size, "patch_size": patch_size, "embed_dim": dim, "depth": 1, "num_heads": heads},
        },
        # the durable path, the engine's worst case: every record written and read back (the default keeps a
        # round shorter than federation.record_after_s in memory, and writes nothing but server.pt)
        "federation": {"accelerator": "cpu", "devices": devices, "record_after_s": 0},
        "logging": {"progress": False},
    }


def peer_config(*, num_clients: int, output_dir: str) -> dict[str, Any]:
    """The peer job (the Flower comparison's): one-shot AFL, bundled digits, a tiny timm ViT (64-d, 2 blocks,
    32 px), Dirichlet α=0.5."""
    return {
        "algorithm": "afl",
        "seed": 0,
        "output_dir": output_dir,
        "run_name": f"peer_k{num_clients}",
        "data": {"name": "digits", "image_size": 32, "batch_size": 64, "feature_cache": False},
        "partition": {"num_clients": num_clients, "alpha": 0.5},
        "model": {
            "library": "timm",
            "name": "vit_base_patch16_224",
            "pretrained": None,
            "overrides": {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2},
        },
        "federation": {"accelerator": "cpu"},
        "logging": {"progress": False},
    }


def _write_yaml(values: dict[str, Any], path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    # one thread per process: 1 and 2 processes then do the same arithmetic, and 2 processes do not
    # oversubscribe a 2-core machine; PYTHONPATH so that a checkout works without installing it
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def _python(args: list[str], *, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(), cwd=_REPO, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... exited {proc.returncode}: {proc.stderr[-3000:]}")
    return wall, proc


# -- measuring inside a worker ---------------------------------------------------------------------------
def _folder_bytes(folder: Path) -> tuple[int, int]:
    """(total bytes, number of files) under ``folder``. Read it on the rank that clears it (rank 0 clears the
    round folder after its own ``on_round_end``); on another rank the files may go while it is read."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return sum(sizes), len(sizes)


class _Probe:
    """A Fabric callback that measures one rank: wall time and bytes written from the end of set-up, the
    round folder's size before it is cleared, peak RSS before and during the federation."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.result: dict[str, Any] = {}

    def on_run_start(self, *, env: Any, run_dir: Path, **_: Any) -> None:
        self.rank, self.ckpt_dir = env.fabric.global_rank, Path(run_dir) / "checkpoints"
        self.result["peak_rss_setup_bytes"] = peak_rss_bytes()
        self.result["peak_rss_reset"] = reset_peak_rss()
        self.start, self.cpu, self.written = time.perf_counter(), time.process_time(), bytes_written()

    def on_round_end(self, *, round_idx: int, **_: Any) -> None:
        # bytes written through the round (plan, client records): what grows with K; the run's constant
        # files (server.pt, metrics.csv, partition.png, summary.json) come after this call
        self.result["bytes_written"] = bytes_written() - self.written
        if self.rank == 0:  # only the server reads the round folder: it clears it once this call returns
            total, files = _folder_bytes(self.ckpt_dir / f"round{round_idx:04d}")
            self.result.update(round_folder_bytes=total, round_folder_files=files)

    def on_run_end(self, **_: Any) -> None:
        self.result["wall_s"] = time.perf_counter() - self.start
        self.result["cpu_s"] = time.process_time() - self.cpu
        self.result["peak_rss_rounds_bytes"] = peak_rss_bytes()
        self.result["rank"] = self.rank
        (self.out_dir / f"rank{self.rank}.json").write_text(json.dumps(self.result), encoding="utf-8")


def _framework_worker(config: Path, out_dir: Path) -> None:
    from fl_lightning.config.loading import load_config
    from fl_lightning.federation.simulation import Simulation

    Simulation(cfg=load_config(config), loggers=[], callbacks=[_Probe(out_dir)]).run()


def _bare_worker(config: Path, out_dir: Path) -> None:
    """The same statistics, sum, solve and accuracy as AFL in a plain PyTorch loop: the same model (built
    by the backbone adapter, which is the model, not the framework) and the same data and partition."""
    import numpy as np
    from torch.utils.data import DataLoader, Subset

    from fl_lightning.algorithms.common import frozen_backbone
    from fl_lightning.config.loading import load_config
    from fl_lightning.data.partition import iid_partition
    from fl_lightning.data.registry import build_dataset
    from fl_lightning.data.transforms import build_transform

    cfg = load_config(config)
    torch.manual_seed(cfg.seed)
    model = frozen_backbone(cfg)
    kw = {"normalization": "imagenet", "image_size": cfg.data.image_size, "mean": tuple(model.mean), "std": tuple(model.std)}
    splits = build_dataset(
        cfg.data.name,
        root=cfg.data.root,
        download=False,
        seed=cfg.seed,
        num_samples=cfg.data.num_samples,
        train_transform=build_transform(**kw, train=False),
        test_transform=build_transform(**kw, train=False),
    )
    parts = iid_partition(len(splits.train_targets), cfg.partition.num_clients, seed=cfg.partition.seed)
    d, c = model.feature_dim, len(splits.classes)

    reset_peak_rss()
    start, cpu = time.perf_counter(), time.process_time()
    R, C = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, c, dtype=torch.float64)
    with torch.inference_mode():
        for idx in parts:  # one client at a time: its own loader and statistics, then the server's sum
            R_k, C_k = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, c, dtype=torch.float64)
            for x, y in DataLoader(Subset(splits.train, idx.tolist()), batch_size=cfg.data.batch_size):
                h = model(x).double()  # (B, d)
                R_k += h.T @ h
                C_k += h.T @ torch.nn.functional.one_hot(y, c).double()
            R += R_k
            C += C_k
        W = torch.linalg.solve(R + cfg.method.lam * torch.eye(d, dtype=torch.float64), C)  # Eq. (9)
        correct = 0
        for x, y in DataLoader(splits.test, batch_size=cfg.data.batch_size):
            correct += int(((model(x).double() @ W).argmax(1) == y).sum())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    torch.save(W, out_dir / "bare_W.pt")
    result = {
        "wall_s": wall,
        "cpu_s": cpu,
        "accuracy": correct / len(splits.test_targets),
        "peak_rss_rounds_bytes": peak_rss_bytes(),
        "num_clients": len(parts),
        "samples": int(sum(len(p) for p in parts)),
        "empty_clients": int(np.sum([len(p) == 0 for p in parts])),
    }
    (out_dir / "bare.json").write_text(json.dumps(result), encoding="utf-8")


def _bare_script_worker(config: Path, out_dir: Path) -> None:
    """The peer job as a user would write it without a framework: torch, timm, sklearn and the partition
    function (numpy only); nothing else of fl_lightning is imported."""
    import numpy as np
    import timm
    import yaml
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from fl_lightning.data.partition import dirichlet_partition

    values = yaml.safe_load(config.read_text(encoding="utf-8"))
    torch.manual_seed(values["seed"])
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=values["seed"]
    )
    model = timm.create_model(values["model"]["name"], pretrained=False, num_classes=0, **values["model"]["overrides"]).eval()
    mean, std = torch.tensor(model.pretrained_cfg["mean"]), torch.tensor(model.pretrained_cfg["std"])
    size = values["data"]["image_size"]

    def images(a: np.ndarray) -> torch.Tensor:  # 8x8 values 0..16 → normalised 3 x size x size
        x = torch.nn.functional.interpolate(
            torch.tensor(a / 16.0, dtype=torch.float32)[:, None], size=size, mode="bilinear", align_corners=False
        ).repeat(1, 3, 1, 1)
        return (x - mean[:, None, None]) / std[:, None, None]

    xs, xt = images(x_train), images(x_test)
    parts = dirichlet_partition(y_train, values["partition"]["num_clients"], values["partition"]["alpha"], seed=0)
    d, c, batch = model.num_features, 10, values["data"]["batch_size"]
    R, C = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, c, dtype=torch.float64)
    with torch.inference_mode():
        for idx in parts:
            for i in range(0, len(idx), batch):
                b = torch.from_numpy(idx[i : i + batch])
                h = model(xs[b]).double()
                R += h.T @ h
                C += h.T @ torch.nn.functional.one_hot(torch.from_numpy(y_train[idx[i : i + batch]]), c).double()
        W = torch.linalg.solve(R + 1e-6 * torch.eye(d, dtype=torch.float64), C)
        accuracy = float((model(xt).double() @ W).argmax(1).eq(torch.from_numpy(y_test)).float().mean())
    (out_dir / "bare.json").write_text(json.dumps({"accuracy": accuracy}), encoding="utf-8")


# process start → first client, by phase, in the path `python -m fl_lightning.train` takes
_FIRST_CLIENT = r"""
import json, sys, time
t, cpu = {"interpreter": time.time()}, {"interpreter": time.process_time()}
from fl_lightning.config.loading import load_config
t["import fl_lightning.config.loading"], cpu["import fl_lightning.config.loading"] = time.time(), time.process_time()
cfg = load_config(sys.argv[1])
t["load_config (imports the methods it discovers)"] = time.time()
cpu["load_config (imports the methods it discovers)"] = time.process_time()
from fl_lightning.federation.simulation import Simulation
t["import simulation"], cpu["import simulation"] = time.time(), time.process_time()
class Stamp:
    def on_run_start(self, **_):
        t.setdefault("launch + set-up (model, data, partition, report)", time.time())
        cpu.setdefault("launch + set-up (model, data, partition, report)", time.process_time())
    def on_client_start(self, **_):
        t.setdefault("first client", time.time())
        cpu.setdefault("first client", time.process_time())
sim = Simulation(cfg=cfg, callbacks=[Stamp()])
t["Simulation()"], cpu["Simulation()"] = time.time(), time.process_time()
sim.run()
json.dump({"wall": t, "cpu": cpu}, open(sys.argv[2], "w"))
"""


def _first_client(config: Path, out: Path) -> dict[str, Any]:
    """Phases (seconds, cumulative from the process's start) and the top imports by cumulative time."""
    start = time.time()
    _, proc = _python(["-X", "importtime", "-c", _FIRST_CLIENT, str(config), str(out)])
    saved = json.loads(out.read_text(encoding="utf-8"))
    stamps, cpu = saved["wall"], saved["cpu"]
    phases, cpu_phases, last, last_cpu = {}, {}, start, 0.0
    order = [
        "interpreter",
        "import fl_lightning.config.loading",
        "load_config (imports the methods it discovers)",
        "import simulation",
        "Simulation()",
        "launch + set-up (model, data, partition, report)",
        "first client",
    ]
    for name in order:
        phases[name], cpu_phases[name] = stamps[name] - last, cpu[name] - last_cpu
        last, last_cpu = stamps[name], cpu[name]
    # CPU seconds of the process (user + system): what the start costs, less skewed by other processes' load
    return {
        "to_first_client_s": stamps["first client"] - start,
        "phases_s": phases,
        "to_first_client_cpu_s": cpu["first client"],
        "phases_cpu_s": cpu_phases,
        "imports_s": _import_times(proc.stderr),
    }


# packages whose import cost matters to the start (nested: torchmetrics is inside lightning.fabric, etc.)
_WATCHED = (
    "torch",
    "lightning",
    "lightning.fabric",
    "lightning.pytorch",
    "torchmetrics",
    "torchvision",
    "torch._dynamo",
    "torchmetrics.functional",
    "transformers",
    "scipy",
    "timm",
    "wandb",
    "open_clip",
    "diffusers",
    "peft",
    "matplotlib",
    "sklearn",
    "rich",
    "fl_lightning.algorithms",
)


def _import_times(importtime: str) -> dict[str, float]:
    """Cumulative import time (seconds, including what each imports first) of the :data:`_WATCHED` modules
    from ``python -X importtime`` output; a module the run never imports is absent."""
    found: dict[str, float] = {}
    for line in importtime.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s+(\S+)$", line)
        if m and m.group(2) in _WATCHED:
            found[m.group(2)] = int(m.group(1)) / 1e6
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


# -- the suite ------------------------------------------------------------------------------------------
def _scale_point(work: Path, sizes: dict[str, Any], k: int, devices: int) -> dict[str, Any]:
    """One framework run at K clients on ``devices`` processes (+ the bare loop when devices == 1)."""
    tag = f"k{k}_p{devices}"
    out = work / tag
    out.mkdir()
    config = _write_yaml(
        scale_config(
            num_clients=k,
            dim=sizes["dim"],
            heads=sizes["heads"],
            num_samples=sizes["num_samples"],
            output_dir=str(work / "runs"),
            devices=devices,
            image_size=sizes["image_size"],
            patch_size=sizes["patch_size"],
        ),
        work / f"{tag}.yaml",
    )
    _python(["-m", "benchmarks.scale", "--worker", "framework", "--config", str(config), "--out", str(out)])
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(devices)]
    run_dir = work / "runs" / f"scale_k{k}"
    point: dict[str, Any] = {
        "wall_s": ranks[0]["wall_s"],
        "cpu_s": [r["cpu_s"] for r in ranks],
        "bytes_written": sum(r["bytes_written"] for r in ranks),
        "round_folder_bytes": ranks[0]["round_folder_bytes"],
        "round_folder_files": ranks[0]["round_folder_files"],
        "peak_rss_rounds_bytes": [r["peak_rss_rounds_bytes"] for r in ranks],
        "peak_rss_since_start_bytes": [max(r["peak_rss_setup_bytes"], r["peak_rss_rounds_bytes"]) for r in ranks],
    }
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    point.update(accuracy=summary["accuracy"], bytes_up=summary["bytes_up"])
    if devices == 1:
        _python(["-m", "benchmarks.scale", "--worker", "bare", "--config", str(config), "--out", str(out)])
        bare = json.loads((out / "bare.json").read_text(encoding="utf-8"))
        W = torch.load(run_dir / "checkpoints" / "server.pt", weights_only=False)["state"]["W"]
        W_bare = torch.load(out / "bare_W.pt")
        point.update(
            bare_s=bare["wall_s"],
            bare_cpu_s=bare["cpu_s"],
            bare_accuracy=bare["accuracy"],
            bare_peak_rss_bytes=bare["peak_rss_rounds_bytes"],
            relative_difference_W=float((W - W_bare).norm() / W_bare.norm()),
        )
        point["overhead_per_client_s"] = (point["wall_s"] - point["bare_s"]) / k
        point["overhead_pct"] = 100.0 * (point["wall_s"] - point["bare_s"]) / point["bare_s"]
        # the same in CPU seconds of the process: less sensitive to other processes' load on a shared machine
        point["cpu_overhead_per_client_s"] = (point["cpu_s"][0] - point["bare_cpu_s"]) / k
        point["cpu_overhead_pct"] = 100.0 * (point["cpu_s"][0] - point["bare_cpu_s"]) / point["bare_cpu_s"]
    shutil.rmtree(run_dir, ignore_errors=True)  # K=10,000 leaves GBs otherwise
    return point


def _peer_point(work: Path, k: int) -> dict[str, Any]:
    out = work / f"peer_k{k}"
    out.mkdir()
    config = _write_yaml(peer_config(num_clients=k, output_dir=str(work / "runs")), work / f"peer_k{k}.yaml")
    framework_s, _ = _python(["-m", "fl_lightning.train", "--config", str(config)])
    bare_s, _ = _python(["-m", "benchmarks.scale", "--worker", "bare-script", "--config", str(config), "--out", str(out)])
    summary = json.loads((work / "runs" / f"peer_k{k}" / "summary.json").read_text(encoding="utf-8"))
    bare = json.loads((out / "bare.json").read_text(encoding="utf-8"))
    return {
        "framework_s": framework_s,
        "bare_script_s": bare_s,
        "ratio": framework_s / bare_s,
        "framework_in_run_s": summary["wall_time_s"],
        "accuracy": summary["accuracy"],
        "bare_accuracy": bare["accuracy"],
    }


def run(
    *,
    quick: bool,
    device: torch.device | None = None,
    clients: Sequence[int] | None = None,
    processes: Sequence[int] = (1, 2),
    extras: bool = True,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Every figure of the suite (see the module docstring). CPU only: the engine's cost is what is measured.

    Args:
        quick: tiny sizes (seconds) instead of the full ones.
        device: ignored (the runs are CPU processes); accepted for the common runner signature.
        clients: the K values (default: ``SIZES[quick]["clients"]``).
        processes: run the framework with 1 and/or 2 processes.
        extras: also time the peer job end to end and the start (process start → first client).
        work_dir: where the runs go (default: a temporary folder, removed afterwards).
    """
    sizes = dict(SIZES[quick])
    ks = sorted(clients or sizes["clients"])
    tmp = tempfile.mkdtemp(prefix="fl_bench_scale_", dir=work_dir)
    work = Path(tmp)
    try:
        per_k: dict[str, Any] = {str(k): {} for k in ks}
        plan = [(k, 1) for k in ks if 1 in processes]
        plan += [(k, 2) for k in ks if 2 in processes and (clients or k in sizes["two_process_clients"])]
        for k, devices in plan:  # each point on stderr as it completes: a long run is readable when cut short
            per_k[str(k)][f"p{devices}"] = point = _scale_point(work, sizes, k, devices)
            print(f"scale K={k} processes={devices}: {json.dumps(point)}", file=sys.stderr, flush=True)
        peer, start = {}, None
        if extras:
            peer = {str(k): _peer_point(work, k) for k in sizes["peer_clients"]}
            print(f"scale peer job: {json.dumps(peer)}", file=sys.stderr, flush=True)
            first = {**peer_config(num_clients=20, output_dir=str(work / "runs")), "run_name": "first_client"}
            start = _first_client(_write_yaml(first, work / "first.yaml"), work / "first.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _figures(sizes, ks, per_k, peer, start)


def _ratio_figure(per_k: dict[str, Any], ks: list[int], ref: int, proc: str, rank: int, note: str) -> dict | None:
    have = [k for k in ks if proc in per_k[str(k)]]
    if len(have) < 2:
        return None
    lo = ref if ref in have else have[0]
    hi = have[-1]
    peak = {k: per_k[str(k)][proc]["peak_rss_rounds_bytes"][rank] for k in have}
    return figure(
        peak[hi] / peak[lo],
        "x",
        op="<=",
        bound=1.2,
        note=f"peak RSS at K={hi} / K={lo}, {proc[1:]} process(es), rank {rank}; {note}",
        details={
            "peak_rss_rounds_bytes": peak,
            "peak_rss_since_start_bytes": {k: per_k[str(k)][proc]["peak_rss_since_start_bytes"][rank] for k in have},
        },
    )


def _figures(
    sizes: dict[str, Any], ks: list[int], per_k: dict[str, Any], peer: dict[str, Any], start: dict[str, Any] | None
) -> dict[str, Any]:
    one = {k: per_k[str(k)]["p1"] for k in ks if "p1" in per_k[str(k)]}
    results: dict[str, Any] = {
        "sizes": {**{k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}, "clients": ks, "per_k": per_k}
    }
    if one:
        worst = max(one, key=lambda k: one[k]["overhead_per_client_s"])
        results["overhead_per_client_s"] = figure(
            one[worst]["overhead_per_client_s"],
            "s",
            op="<=",
            bound=0.01,
            note=f"(wall − bare)/K, worst K={worst}; 1 process",
            details={
                str(k): {
                    n: p[n]
                    for n in (
                        "wall_s",
                        "bare_s",
                        "overhead_per_client_s",
                        "cpu_s",
                        "bare_cpu_s",
                        "cpu_overhead_per_client_s",
                        "relative_difference_W",
                    )
                }
                for k, p in one.items()
            },
        )
        worst = max(one, key=lambda k: one[k]["overhead_pct"])
        results["overhead_vs_compute_pct"] = figure(
            one[worst]["overhead_pct"],
            "%",
            op="<=",
            bound=2.0,
            note=f"100·(wall − bare)/bare, worst K={worst}",
            details={str(k): {"wall": p["overhead_pct"], "cpu": p["cpu_overhead_pct"]} for k, p in one.items()},
        )
        per_client = {k: p["bytes_written"] / k for k, p in one.items()}
        results["checkpoint_bytes_linearity"] = figure(
            max(per_client.values()) / min(per_client.values()),
            "x",
            op="<=",
            bound=1.05,
            note="bytes written per client (wchar), max/min over K; 1.0 = linear in K",
            details={
                str(k): {
                    "bytes_written": p["bytes_written"],
                    "per_client": per_client[k],
                    "round_folder_bytes": p["round_folder_bytes"],
                    "records": p["round_folder_files"],
                    "bytes_up": p["bytes_up"],
                }
                for k, p in one.items()
            },
        )
    for proc, rank, name in (
        ("p1", 0, "rss_rank0_ratio"),
        ("p2", 0, "rss_rank0_ratio_2proc"),
        ("p2", 1, "rss_other_ranks_ratio"),
    ):
        fig = _ratio_figure(per_k, ks, sizes["reference_clients"], proc, rank, "reset after set-up")
        if fig is not None:
            results[name] = fig
    if peer:
        last = str(max(peer, key=int))
        results["peer_job_vs_bare"] = figure(
            peer[last]["ratio"], "x", note=f"end-to-end wall, python -m fl_lightning.train / bare script, K={last}", details=peer
        )
    if start is not None:
        results["first_client_s"] = figure(
            start["to_first_client_s"],
            "s",
            op="<=",
            bound=4.0,
            note="process start → first client, peer job (timm), K=20",
            details=start,
        )
    return results


# -- worker entry ---------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description="one measured run of the scale benchmark (used by the suite)"
    )
    parser.add_argument("--worker", choices=("framework", "bare", "bare-script"), required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    {"framework": _framework_worker, "bare": _bare_worker, "bare-script": _bare_script_worker}[args.worker](args.config, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
