"""The GPU check (docs/gpu.md, "GPU check"): ``scripts/gpu_check.sh`` runs ``python -m benchmarks.gpu_check``.

On a machine with CUDA GPUs, in a few minutes:

1. ``throughput``: ViT-B/16 (timm ``vit_base_patch16_224``, built without weights) in bf16 autocast, its frozen
   trunk held in bf16 as a run holds it (``federation/precision.py``): images/s of prompt tuning (M = 10 prompts
   and a linear head trained, the trunk frozen: forward and backward) and of the statistics pass (forward only,
   R = Σ h hᵀ and C = Σ h yᵀ in float64), each with its achieved FLOP/s against the GPU's dense bf16 roof
   (:data:`ROOFS`, by ``torch.cuda.get_device_name``; unknown GPUs print ``n/a``). FLOPs are counted from the
   architecture (:func:`vit_forward_flops`); prompt tuning is counted as twice the forward (the backward reaches
   the activations and the prompts, not the frozen weights: an estimate).
2. ``loader``: images/s that reach the GPU, normalised, from the uint8 store's loader with the workers ``auto``
   gives one rank of this machine (``benchmarks.loader.device_images_per_s``), against what a ViT-B/16 bf16
   training step needs on an H100 (``required_images_per_s``); then ``python -m benchmarks loader`` (the CPU
   side per path and worker count) must run.
3. ``ranks``: a tiny FedOPAL and a tiny FeDiSyn on 1 and on 2 GPUs give the same ``summary.json`` accuracy
   (skipped with fewer than 2 GPUs).
4. ``fp16``: a tiny FedOPAL under ``16-mixed`` (its prompt tuning through a ``GradScaler``) learns: accuracy
   above 3× chance. FedOPAL's analytic solve carries most of that accuracy, so a second check trains what only
   gradient steps can: FedAvg of a linear head under ``16-mixed`` (5 rounds of 5 epochs) must beat the same run
   with no local training (``train.epochs 0``: the random head) by 0.1 — a scaler that never steps (every step
   skipped as inf) or gradients lost to fp16 underflow fail it.

``--cpu`` runs the same checks at tiny sizes on the CPU (bf16 autocast there; ranks as 2 CPU processes; the
``16-mixed`` run is Fabric's ``bf16-mixed`` on the CPU): a smoke test of the script, not a measurement. Each
check prints one line; the last line counts the failures; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks._timing import figure

__all__ = ["ROOFS", "roof_flops", "vit_forward_flops", "run", "main"]

_REPO = Path(__file__).resolve().parents[1]
_CONF = _REPO / "conf"
# dense bf16 tensor-core peaks (FLOP/s, no sparsity), matched as substrings of torch.cuda.get_device_name, first
# match wins: H100/H200 SXM 989 T (an H100 PCIe is 756 T: "H100 PCIe" comes first), A100 312 T, RTX 4090 165 T
ROOFS: tuple[tuple[str, float], ...] = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12),
                                       ("GH200", 989e12), ("A100", 312e12), ("4090", 165e12))
_TINY_VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2}


def roof_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name`` (FLOP/s), or None when it is not in :data:`ROOFS`."""
    return next((flops for key, flops in ROOFS if key.lower() in device_name.lower()), None)


def vit_forward_flops(*, image_size: int, patch_size: int, width: int, depth: int, extra_tokens: int = 0,
                      mlp_ratio: float = 4.0) -> float:
    """FLOPs (2 per multiply-add) of one image through a ViT: patch embedding, then per block the qkv and output
    projections (4·N·D² MACs), the MLP (2·r·N·D²) and attention's two N×N products (2·N²·D); N = 1 + L + M."""
    patches = (image_size // patch_size) ** 2
    n, d = 1 + patches + extra_tokens, width
    embed = patches * 3 * patch_size**2 * d
    block = (4 + 2 * mlp_ratio) * n * d * d + 2 * n * n * d
    return 2.0 * (embed + depth * block)


# ------------------------------------------------------------------------------------------ throughput
def _vit(cpu: bool, device: torch.device) -> nn.Module:
    import timm

    from fl_lightning.federation.precision import trunk_dtype

    kwargs = _TINY_VIT if cpu else {}
    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, **kwargs)
    model = model.requires_grad_(False).eval().to(device)
    dtype = trunk_dtype("bf16-mixed", device, model)  # CUDA: the frozen trunk in bf16, as a run holds it
    return model if dtype is None else model.to(dtype)


def _features(model: nn.Module, images: Tensor, prompts: Tensor | None) -> Tensor:
    """The CLS feature of ``images``, with ``prompts`` (M, D) inserted after the CLS token (VPT-shallow)."""
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    if prompts is not None:
        p = prompts.to(tokens.dtype).unsqueeze(0).expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([tokens[:, :1], p, tokens[:, 1:]], dim=1)
    return model.norm(model.blocks(tokens))[:, 0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(*, cpu: bool, device: torch.device, batch: int, steps: int, num_prompts: int = 10,
               classes: int = 10) -> dict[str, dict[str, float]]:
    """Images/s and FLOP/s of prompt tuning and of the statistics pass (module docstring)."""
    model = _vit(cpu, device)
    width, size = model.embed_dim, model.patch_embed.img_size[0]
    patch = model.patch_embed.patch_size[0]
    g = torch.Generator(device="cpu").manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=g).to(device)
    labels = torch.randint(0, classes, (batch,), generator=g).to(device)
    prompts = nn.Parameter(torch.randn(num_prompts, width, generator=g).mul_(0.02).to(device))
    head = nn.Linear(width, classes).to(device)
    optimizer = torch.optim.SGD([prompts, *head.parameters()], lr=0.01, momentum=0.9)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def tune() -> None:
        with autocast:
            loss = nn.functional.cross_entropy(head(_features(model, images, prompts)).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    R = torch.zeros(width, width, dtype=torch.float64, device=device)
    C = torch.zeros(width, classes, dtype=torch.float64, device=device)
    onehot = nn.functional.one_hot(labels, classes).double()

    @torch.no_grad()
    def statistics() -> None:
        with autocast:
            h = _features(model, images, prompts).double()
        R.addmm_(h.T, h)
        C.addmm_(h.T, onehot)

    out: dict[str, dict[str, float]] = {}
    forward = vit_forward_flops(image_size=size, patch_size=patch, width=width, depth=len(model.blocks),
                                extra_tokens=num_prompts)
    for name, step, flops in (("prompt_tuning", tune, 2 * forward), ("statistics", statistics, forward)):
        for _ in range(2):  # warm-up: kernels chosen, allocator filled
            step()
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        seconds = time.perf_counter() - start
        images_s = batch * steps / seconds
        out[name] = {"images_s": images_s, "flops_s": images_s * flops, "batch": batch, "steps": steps}
    return out


# ------------------------------------------------------------------------------------------ runs
def _train(work: Path, name: str, config: str, overrides: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """``python -m fl_lightning.train`` of ``config`` in a fresh process; its summary.json (or the error's tail)."""
    out = work / name
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    command = [sys.executable, "-m", "fl_lightning.train", "--config", str(_CONF / config), "--output_dir",
               str(out), "--run_name", name, "--logging.progress", "false", *overrides]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=_REPO, timeout=timeout_s)
    summary = out / name / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:]) or f"exit {proc.returncode}"
        return {"error": f"exit {proc.returncode}: {tail[-300:]}"}
    return json.loads(summary.read_text(encoding="utf-8"))


# tiny runs: (config, overrides that keep them to seconds)
_RANK_RUNS = {"fedopal": ("fedopal_digits_tiny.yaml", ("--train.epochs", "1")),
              "fedisyn": ("fedisyn_tiny.yaml", ())}


def _check(lines: list[str], failures: list[str], name: str, ok: bool | None, text: str) -> None:
    """One printed line ``name: text: ok|FAILED|skipped``; a False ``ok`` is counted."""
    status = "skipped" if ok is None else ("ok" if ok else "FAILED")
    line = f"{name}: {text}: {status}"
    lines.append(line)
    print(line, flush=True)
    if ok is False:
        failures.append(name)


def run_checks(*, cpu: bool, work: Path, gpus: int | None = None) -> tuple[list[str], list[str], dict[str, Any]]:
    """Every check of the module docstring; returns the printed lines, the failed checks' names and the numbers."""
    lines: list[str] = []
    failures: list[str] = []
    numbers: dict[str, Any] = {}
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    gpus = torch.cuda.device_count() if gpus is None else gpus
    name = "cpu" if cpu else torch.cuda.get_device_name(device)
    roof = None if cpu else roof_flops(name)
    header = (f"gpu_check: device {name}, bf16 roof {roof / 1e12:.0f} TFLOP/s" if roof
              else f"gpu_check: device {name}, bf16 roof n/a")
    print(header, flush=True)
    lines.append(header)

    # 1. throughput
    sizes = {"batch": 8, "steps": 2} if cpu else {"batch": 64, "steps": 20}
    numbers["throughput"] = measured = throughput(cpu=cpu, device=device, **sizes)
    for what, m in measured.items():
        share = f"{100 * m['flops_s'] / roof:.1f} % of roof" if roof else "roof n/a"
        _check(lines, failures, f"throughput {what}", m["images_s"] > 0,
               f"{m['images_s']:.1f} images/s, {m['flops_s'] / 1e12:.3f} TFLOP/s, {share}")

    # 2. the data path into the device, then the loader benchmark's CPU figures
    from benchmarks.loader import FORWARD_GFLOP, device_images_per_s, required_images_per_s
    from fl_lightning.cores import available_cpus
    from fl_lightning.data.loader import resolve_loader_settings

    workers = resolve_loader_settings("auto", "auto", "auto", cuda=not cpu, cpus=available_cpus(),
                                      ranks_on_node=1).num_workers
    rate = device_images_per_s(device, workers=workers, images=64 if cpu else 1024, passes=1 if cpu else 2)
    need = required_images_per_s(FORWARD_GFLOP["vit_b16"])
    numbers["loader"] = {"images_s": rate, "workers": workers, "vit_b16_needs_images_s": need}
    command = [sys.executable, "-m", "benchmarks", "loader", *(["--quick"] if cpu else [])]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=_REPO, timeout=300)
    _check(lines, failures, "loader", rate > 0 and proc.returncode == 0,
           f"{rate:.0f} images/s onto {device.type} from the uint8 store with {workers} worker(s) (a ViT-B/16 bf16 "
           f"step on an H100 needs {need:.0f}); python -m benchmarks loader exit {proc.returncode}")

    accelerator = ["--federation.accelerator", "cpu" if cpu else "gpu"]
    # 3. one rank and two give the same accuracy
    for method, (config, extra) in _RANK_RUNS.items():
        if not cpu and gpus < 2:
            _check(lines, failures, f"ranks {method}", None, f"{gpus} GPU (2 needed)")
            continue
        got = {n: _train(work, f"{method}_r{n}", config, [*accelerator, "--federation.devices", str(n), *extra],
                         timeout_s=600) for n in (1, 2)}
        numbers[f"ranks_{method}"] = got
        if any("error" in s for s in got.values()):
            errors = "; ".join(f"{n} rank(s) {s['error']}" for n, s in got.items() if "error" in s)
            _check(lines, failures, f"ranks {method}", False, errors)
            continue
        a1, a2 = got[1]["accuracy"], got[2]["accuracy"]
        _check(lines, failures, f"ranks {method}", a1 == a2,
               f"1 rank accuracy {a1:.4f}, 2 ranks {a2:.4f} (difference {a2 - a1:+.2e})")

    # 4. 16-mixed learns (on the CPU Fabric runs it as bf16-mixed)
    config, extra = _RANK_RUNS["fedopal"]
    s = _train(work, "fedopal_16mixed", config, [*accelerator, "--federation.precision", "16-mixed", *extra],
               timeout_s=600)
    numbers["fp16"] = s
    if "error" in s:
        _check(lines, failures, "fp16 fedopal", False, s["error"])
    else:
        chance = 1.0 / 10  # digits: 10 classes
        _check(lines, failures, "fp16 fedopal", s["accuracy"] > 3 * chance,
               f"16-mixed accuracy {s['accuracy']:.4f} (chance {chance:.2f}, bar {3 * chance:.2f})")

    # 5. 16-mixed gradient steps do the learning: FedAvg's head trained against the same head untrained
    trained, untrained = (_train(work, f"fedavg_16mixed_e{e}", "fedavg_digits_tiny.yaml",
                                 [*accelerator, "--federation.precision", "16-mixed", "--train.epochs", str(e),
                                  "--federation.rounds", "5"], timeout_s=600) for e in (5, 0))
    numbers["fp16_fedavg"] = {"trained": trained, "untrained": untrained}
    if "error" in trained or "error" in untrained:
        _check(lines, failures, "fp16 fedavg", False, trained.get("error") or untrained["error"])
    else:
        a, b = trained["accuracy"], untrained["accuracy"]
        _check(lines, failures, "fp16 fedavg", a > b + 0.1,
               f"16-mixed head accuracy {a:.4f}, untrained {b:.4f} (bar {b + 0.1:.2f})")

    last = f"gpu_check: {len(lines) - 1} checks, {len(failures)} failed" + (f" ({', '.join(failures)})" if failures else "")
    print(last, flush=True)
    lines.append(last)
    return lines, failures, numbers


def run(*, quick: bool, device: torch.device | None = None, work_dir: Path | None = None) -> dict[str, Any]:
    """The registry's entry (``python -m benchmarks gpu_check``): the checks as figures; ``quick`` or no CUDA
    device: the CPU smoke sizes."""
    cpu = quick or device is None or device.type != "cuda"
    with tempfile.TemporaryDirectory(prefix="fl_gpu_check_", dir=work_dir) as work:
        lines, failures, numbers = run_checks(cpu=cpu, work=Path(work))
    results: dict[str, Any] = {f"{k}_images_s": figure(v["images_s"], "images/s", note="ViT bf16")
                               for k, v in numbers["throughput"].items()}
    results["failed_checks"] = figure(float(len(failures)), "checks", op="<=", bound=0.0, note="; ".join(lines[1:-1]))
    results["sizes"] = {"cpu": cpu, "numbers": numbers}
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the same checks at tiny sizes on the CPU (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; run with --cpu for the smoke test", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fl_gpu_check_") as work:
        _, failures, numbers = run_checks(cpu=args.cpu, work=Path(work))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(numbers, indent=2, default=str) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
