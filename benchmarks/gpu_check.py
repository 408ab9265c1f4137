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
3. ``ranks``: a tiny FedOPAL and a tiny FeDiSyn (its SD fp16 generation, writer thread, VAE encode, pre-training
   Trainer and store on the device) on 1 rank and on 2 give the same ``summary.json`` accuracy: on 2 GPUs over NCCL
   where there are 2, else as 2 processes sharing GPU 0 over gloo (``federation.process_group_backend gloo``, two
   one-process "nodes" under torchrun on 127.0.0.1): the joined DDP, the split ensemble, the outcome exchanges and
   rank 0's hand-overs with CUDA tensors on a machine with one GPU.
4. ``bf16``/``fp16``: a tiny FedOPAL under ``bf16-mixed`` and under ``16-mixed`` (its prompt tuning through a
   ``GradScaler``) learns: accuracy above 3× chance. FedOPAL's analytic solve carries most of that accuracy, so
   a further check trains what only gradient steps can: FedAvg of a linear head under ``16-mixed`` (5 rounds of 5
   epochs) must beat the same run with no local training (``train.epochs 0``: the random head) by 0.1 — a scaler
   that never steps (every step skipped as inf) or gradients lost to fp16 underflow fail it.
5. ``dense``: the tiny DENSE (a timm CNN's local training, the generator's synthesis, the distillation) runs through
   under ``bf16-mixed`` on the GPU; its student's and the clients' ensemble's accuracies are printed.
6. ``stopped rank``: one injected failure — two ranks on one device, rank 1 frozen by SIGSTOP as round 0 starts
   (``tests/federation/rank_safety_job.py``'s hook): the job must end within a minute (liveness 10 s), every process
   with a failing status, rank 0 saying one line that names rank 1. NCCL notices no frozen peer; the liveness
   watch must.

Each run's peak GPU memory (``summary.json``'s ``peak_gpu_memory_bytes``, rank 0's) and wall time close the output
in one table. ``--cpu`` runs the same checks at tiny sizes on the CPU (bf16 autocast there; the two ranks as CPU
processes; the ``16-mixed`` run is Fabric's ``bf16-mixed`` on the CPU; DENSE shortened and in 32-true, as oneDNN's
bf16 convolution backward can give NaN): a smoke test of the script, not a measurement. Each check prints one
line; the last line counts the failures; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
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
ROOFS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("4090", 165e12),
)
_TINY_VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2}


def roof_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name`` (FLOP/s), or None when it is not in :data:`ROOFS`."""
    return next((flops for key, flops in ROOFS if key.lower() in device_name.lower()), None)


def vit_forward_flops(
    *, image_size: int, patch_size: int, width: int, depth: int, extra_tokens: int = 0, mlp_ratio: float = 4.0
) -> float:
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


def throughput(
    *, cpu: bool, device: torch.device, batch: int, steps: int, num_prompts: int = 10, classes: int = 10
) -> dict[str, dict[str, float]]:
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
    forward = vit_forward_flops(image_size=size, patch_size=patch, width=width, depth=len(model.blocks), extra_tokens=num_prompts)
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
_JOB = _REPO / "tests" / "federation" / "rank_safety_job.py"  # the CLI with a hook that stops a rank (SIGSTOP)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def _commands(entry: Sequence[str], args: Sequence[str], shared: int) -> list[list[str]]:
    """One command (``shared`` = 1: Fabric launches the ranks ``args`` ask for), or one per rank for ``shared``
    ranks on one device: "nodes" of one process each under torchrun over 127.0.0.1, their compute group on gloo
    (NCCL refuses two ranks on one GPU), every process on device 0 — the multi-rank paths (the joined DDP, the split
    ensemble, the outcome exchanges, rank 0's hand-overs) with CUDA tensors on a machine with one GPU."""
    if shared == 1:
        return [[sys.executable, *entry, *args]]
    port = _free_port()
    ranks = ["--federation.num_nodes", str(shared), "--federation.devices", "1", "--federation.process_group_backend", "gloo"]
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(shared),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            *entry,
            *args,
            *ranks,
        ]
        for node in range(shared)
    ]


def _launch(commands: list[list[str]], env: dict[str, str], timeout_s: float) -> tuple[list[int], str, float]:
    """Run ``commands`` side by side: their exit statuses, the first failing one's stderr (or the last's) and the
    wall time; every process is killed at ``timeout_s``."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=_REPO, start_new_session=True
        )
        for c in commands
    ]
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - start)))[1] or "")
    except subprocess.TimeoutExpired:
        errs.append(f"timed out after {timeout_s:.0f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    codes = [p.returncode for p in procs]
    failing = next((e for e, c in zip(errs, codes) if c != 0), errs[-1] if errs else "")
    return codes, failing, time.perf_counter() - start


def _train(work: Path, name: str, config: str, overrides: Sequence[str], timeout_s: float, shared: int = 1) -> dict[str, Any]:
    """``python -m fl_lightning.train`` of ``config`` in fresh processes (``shared`` ranks on one device, see
    :func:`_commands`); its summary.json with the wall time (``check_s``), or the error's tail."""
    out = work / name
    args = [
        "--config",
        str(_CONF / config),
        "--output_dir",
        str(out),
        "--run_name",
        name,
        "--logging.progress",
        "false",
        *overrides,
    ]
    codes, stderr, wall = _launch(_commands(["-m", "fl_lightning.train"], args, shared), _env(), timeout_s)
    summary = out / name / "summary.json"
    if any(codes) or not summary.is_file():
        tail = " ".join(stderr.strip().splitlines()[-1:]) or f"exit {codes}"
        return {"error": f"exit {codes}: {tail[-300:]}", "check_s": wall}
    return {**json.loads(summary.read_text(encoding="utf-8")), "check_s": wall}


def _stopped_rank(work: Path, accelerator: Sequence[str], liveness_s: float = 10.0) -> dict[str, Any]:
    """Two ranks on one device (as :func:`_commands`), rank 1 frozen (SIGSTOP) as round 0 starts: how long the job
    took after the freeze, the processes' exit statuses and rank 0's own lines (``tests/federation/
    rank_safety_job.py`` runs the CLI with that hook; NCCL would notice no frozen peer: the liveness watch must)."""
    out = work / "stopped_rank"
    args = [
        str(out),
        "--config",
        str(_CONF / "fedavg_digits_tiny.yaml"),
        "--output_dir",
        str(work / "runs"),
        "--federation.rounds",
        "1",
        "--logging.progress",
        "false",
        "--federation.liveness_timeout_s",
        str(liveness_s),
        *accelerator,
    ]
    env = {**_env(), "FL_TEST_SIGNAL_HOOK": "on_round_start:1:SIGSTOP", "OMP_NUM_THREADS": "1"}
    codes, _, wall = _launch(_commands([str(_JOB)], args, 2), env, timeout_s=240)
    for pid_file in out.glob("rank*.pid"):  # a frozen rank the watch did not end (the check then fails)
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    raised = out / "raised"
    after = time.time() - float(raised.read_text()) if raised.is_file() else None
    rank0 = (out / "rank0.err").read_text() if (out / "rank0.err").is_file() else ""
    ended = (out / "rank0.err").stat().st_mtime - float(raised.read_text()) if after is not None and rank0 else None
    lines = [line for line in rank0.splitlines() if line.startswith("fl_lightning:")]
    return {"codes": codes, "ended_after_s": ended, "lines": lines, "check_s": wall, "liveness_timeout_s": liveness_s}


# tiny runs: (config, overrides that keep them to seconds)
_RANK_RUNS = {"fedopal": ("fedopal_digits_tiny.yaml", ("--train.epochs", "1")), "fedisyn": ("fedisyn_tiny.yaml", ())}
# DENSE (a timm CNN's local training, the generator, the KD) on the device, shortened on the CPU
_DENSE = ("dense_digits_tiny.yaml", ("--federation.rounds", "1"))
_DENSE_CPU = ("--train.epochs", "1", "--dense.epochs", "2", "--dense.g_steps", "5")


def _gib(summary: dict[str, Any]) -> str:
    peak = summary.get("peak_gpu_memory_bytes")
    return "n/a" if peak is None else f"{peak / 2**30:.2f} GiB"


class _Checks:
    """The printed check lines, the failed checks' names, and a row per check for the closing table."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failures: list[str] = []
        self.rows: list[tuple[str, str, str, str]] = []

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def add(self, name: str, ok: bool | None, text: str, *, seconds: float | None = None, peak: str = "n/a") -> None:
        """One printed line ``name: text: ok|FAILED|skipped``; a False ``ok`` is counted."""
        status = "skipped" if ok is None else ("ok" if ok else "FAILED")
        self.say(f"{name}: {text}: {status}")
        self.rows.append((name, status, "-" if seconds is None else f"{seconds:.1f}", peak))
        if ok is False:
            self.failures.append(name)

    def table(self) -> None:
        """The closing table: check, status, seconds, peak GPU memory (of the run's rank 0)."""
        width = max(len(r[0]) for r in self.rows)
        self.say(f"{'check':<{width}}  {'status':<7}  {'seconds':>7}  peak GPU memory")
        for name, status, seconds, peak in self.rows:
            self.say(f"{name:<{width}}  {status:<7}  {seconds:>7}  {peak}")


def _check_ranks(checks: _Checks, work: Path, accelerator: list[str], *, cpu: bool, gpus: int) -> None:
    """1 rank and 2 give the same accuracy: 2 GPUs over NCCL where there are 2, else 2 processes sharing device 0
    over gloo (CUDA tensors on a GPU)."""
    shared = 1 if not cpu and gpus >= 2 else 2
    how = "2 GPUs" if shared == 1 else ("2 processes on the CPU" if cpu else "2 processes on one GPU (gloo)")
    for method, (config, extra) in _RANK_RUNS.items():
        one = _train(work, f"{method}_r1", config, [*accelerator, *extra], timeout_s=600)
        two = _train(
            work,
            f"{method}_r2",
            config,
            [*accelerator, *extra, *(["--federation.devices", "2"] if shared == 1 else [])],
            timeout_s=600,
            shared=shared,
        )
        seconds = one["check_s"] + two["check_s"]
        if "error" in one or "error" in two:
            errors = "; ".join(f"{n} rank(s) {s['error']}" for n, s in ((1, one), (2, two)) if "error" in s)
            checks.add(f"ranks {method}", False, errors, seconds=seconds)
            continue
        a1, a2 = one["accuracy"], two["accuracy"]
        checks.add(
            f"ranks {method}",
            a1 == a2,
            f"1 rank accuracy {a1:.4f}, 2 ranks {a2:.4f} ({how}; difference {a2 - a1:+.2e})",
            seconds=seconds,
            peak=f"{_gib(one)} / {_gib(two)}",
        )


def _check_learning(checks: _Checks, work: Path, accelerator: list[str], *, cpu: bool) -> None:
    """bf16-mixed and 16-mixed runs learn; DENSE runs through on the device (its accuracies printed)."""
    chance = 1.0 / 10  # digits: 10 classes
    config, extra = _RANK_RUNS["fedopal"]
    for precision, name in (("bf16-mixed", "bf16 fedopal"), ("16-mixed", "fp16 fedopal")):
        s = _train(
            work, name.replace(" ", "_"), config, [*accelerator, "--federation.precision", precision, *extra], timeout_s=600
        )
        ok = "error" not in s and s["accuracy"] > 3 * chance
        text = s.get("error") or f"{precision} accuracy {s['accuracy']:.4f} (chance {chance:.2f}, bar {3 * chance:.2f})"
        checks.add(name, ok, text, seconds=s["check_s"], peak=_gib(s))

    # 16-mixed gradient steps do the learning: FedAvg's head trained against the same head untrained
    trained, untrained = (
        _train(
            work,
            f"fedavg_16mixed_e{e}",
            "fedavg_digits_tiny.yaml",
            [*accelerator, "--federation.precision", "16-mixed", "--train.epochs", str(e), "--federation.rounds", "5"],
            timeout_s=600,
        )
        for e in (5, 0)
    )
    seconds = trained["check_s"] + untrained["check_s"]
    if "error" in trained or "error" in untrained:
        checks.add("fp16 fedavg", False, trained.get("error") or untrained["error"], seconds=seconds)
    else:
        a, b = trained["accuracy"], untrained["accuracy"]
        checks.add(
            "fp16 fedavg",
            a > b + 0.1,
            f"16-mixed head accuracy {a:.4f}, untrained {b:.4f} (bar {b + 0.1:.2f})",
            seconds=seconds,
            peak=_gib(trained),
        )

    # DENSE: 32-true on the CPU (oneDNN's bf16 convolution backward can give NaN there), bf16-mixed on a GPU
    config, extra = _DENSE
    precision = "32-true" if cpu else "bf16-mixed"
    s = _train(
        work,
        "dense",
        config,
        [*accelerator, *extra, "--federation.precision", precision, *(_DENSE_CPU if cpu else ())],
        timeout_s=600,
    )
    ok = "error" not in s and s["accuracy"] is not None and 0 <= s["accuracy"] <= 1
    text = s.get("error") or (
        f"{precision} student accuracy {s['accuracy']:.4f}, clients' ensemble "
        f"{s.get('ensemble_accuracy', float('nan')):.4f} (chance {chance:.2f})"
    )
    checks.add("dense", ok, text, seconds=s["check_s"], peak=_gib(s))


def _check_stopped_rank(checks: _Checks, work: Path, accelerator: list[str]) -> None:
    """One injected failure: a rank frozen mid-run ends the job within a minute, with one line naming it."""
    got = _stopped_rank(work, accelerator)
    ended, lines = got["ended_after_s"], got["lines"]
    ok = (
        ended is not None
        and ended < 60
        and all(c != 0 for c in got["codes"])
        and len(lines) == 1
        and "rank 1" in lines[0]
        and "stopped answering" in lines[0]
    )
    said = lines[0] if len(lines) == 1 else f"{len(lines)} lines"
    text = (
        f"rank 1 frozen (SIGSTOP) on round 0: the job ended {'never' if ended is None else f'{ended:.1f} s'} "
        f"after (liveness {got['liveness_timeout_s']:g} s, bar 60 s), exit {got['codes']}; rank 0 said: {said}"
    )
    checks.add("stopped rank", ok, text, seconds=got["check_s"])


def run_checks(*, cpu: bool, work: Path, gpus: int | None = None) -> tuple[list[str], list[str], dict[str, Any]]:
    """Every check of the module docstring; returns the printed lines, the failed checks' names and the numbers."""
    checks = _Checks()
    numbers: dict[str, Any] = {}
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    gpus = torch.cuda.device_count() if gpus is None else gpus
    name = "cpu" if cpu else torch.cuda.get_device_name(device)
    roof = None if cpu else roof_flops(name)
    checks.say(
        f"gpu_check: device {name}, bf16 roof {roof / 1e12:.0f} TFLOP/s" if roof else f"gpu_check: device {name}, bf16 roof n/a"
    )

    # 1. throughput
    sizes = {"batch": 8, "steps": 2} if cpu else {"batch": 64, "steps": 20}
    numbers["throughput"] = measured = throughput(cpu=cpu, device=device, **sizes)
    for what, m in measured.items():
        share = f"{100 * m['flops_s'] / roof:.1f} % of roof" if roof else "roof n/a"
        checks.add(
            f"throughput {what}", m["images_s"] > 0, f"{m['images_s']:.1f} images/s, {m['flops_s'] / 1e12:.3f} TFLOP/s, {share}"
        )

    # 2. the data path into the device, then the loader benchmark's CPU figures
    from benchmarks.loader import FORWARD_GFLOP, device_images_per_s, required_images_per_s
    from fl_lightning.cores import available_cpus
    from fl_lightning.data.loader import resolve_loader_settings

    workers = resolve_loader_settings("auto", "auto", "auto", cuda=not cpu, cpus=available_cpus(), ranks_on_node=1).num_workers
    start = time.perf_counter()
    rate = device_images_per_s(device, workers=workers, images=64 if cpu else 1024, passes=1 if cpu else 2)
    need = required_images_per_s(FORWARD_GFLOP["vit_b16"])
    numbers["loader"] = {"images_s": rate, "workers": workers, "vit_b16_needs_images_s": need}
    command = [sys.executable, "-m", "benchmarks", "loader", *(["--quick"] if cpu else [])]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=_REPO, timeout=300)
    checks.add(
        "loader",
        rate > 0 and proc.returncode == 0,
        f"{rate:.0f} images/s onto {device.type} from the uint8 store with {workers} worker(s) (a ViT-B/16 bf16 "
        f"step on an H100 needs {need:.0f}); python -m benchmarks loader exit {proc.returncode}",
        seconds=time.perf_counter() - start,
    )

    # 3.-6. runs: ranks, precisions, DENSE, a stopped rank
    accelerator = ["--federation.accelerator", "cpu" if cpu else "gpu"]
    _check_ranks(checks, work, accelerator, cpu=cpu, gpus=gpus)
    _check_learning(checks, work, accelerator, cpu=cpu)
    _check_stopped_rank(checks, work, accelerator)
    numbers["table"] = checks.rows

    checks.table()
    failures = checks.failures
    checks.say(
        f"gpu_check: {len(checks.rows)} checks, {len(failures)} failed" + (f" ({', '.join(failures)})" if failures else "")
    )
    return checks.lines, failures, numbers


def run(*, quick: bool, device: torch.device | None = None, work_dir: Path | None = None) -> dict[str, Any]:
    """The registry's entry (``python -m benchmarks gpu_check``): the checks as figures; ``quick`` or no CUDA
    device: the CPU smoke sizes."""
    cpu = quick or device is None or device.type != "cuda"
    with tempfile.TemporaryDirectory(prefix="fl_gpu_check_", dir=work_dir) as work:
        lines, failures, numbers = run_checks(cpu=cpu, work=Path(work))
    results: dict[str, Any] = {
        f"{k}_images_s": figure(v["images_s"], "images/s", note="ViT bf16") for k, v in numbers["throughput"].items()
    }
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
