"""A multi-round round against a bare loop: ``python -m benchmarks engine``.

The job: FedAvg of a whole timm ResNet-18 (``fedavg_cnn``) on the bundled digits at 16 px,
K = 50 Dirichlet clients (α = 0.5), 10 sampled a round, 30 rounds, 1 local epoch of SGD (lr 0.05,
momentum 0.9, batch 32), the test accuracy after every round (``--clients 1000``: the generated
``synthetic`` images in shards, 16 per client, :func:`engine_config`). It runs twice, each in a fresh
process with the same number of torch threads:

* the framework: ``Simulation`` as ``python -m fl_lightning.train`` builds it (default loggers: the CSV
  log; the run folder, its records and checkpoints), timed by a callback from each round's start to the
  next one's (so a round's checkpoint, ``metrics.csv`` and clean-up are in it), the last round to the
  end of the rounds (its checkpoint durable); the one-off end-of-run reports after that (the partition
  figure, ``summary.json``) are given apart (``report_s``), not spread over the rounds;
* a bare loop: torch, timm, scikit-learn and the pure functions of the arithmetic (the Dirichlet or
  shard partition, the client sampling and seeds; the synthetic generator for the large-K job); the images
  preprocessed once into one tensor, ONE model
  object, an SGD optimiser per client, the float64 weighted mean, the test accuracy — the same
  arithmetic, so the two must agree on the test accuracy of EVERY round (checked: a mismatch is an
  error, not a figure).

Figures: ``round_ratio`` = mean framework round / mean bare round (bound 1.15), at each thread count
asked for (``--threads 1,2``), and, with ``--model large`` (a half-width ResNet-18, ~2.8 M parameters)
or ``--clients 1000`` (10 a round), at that size. ``start_ratio`` = process start → first client of
the framework over ``python -c "import torch, timm"`` timed in the same run (bound 1.15);
``start_ratio_with_data_library`` puts scikit-learn into that reference, since the bundled digits are
scikit-learn's and their split is its ``train_test_split`` (the bare loop imports it too), and
``start_ratio_with_data_library_collector_paused`` runs those imports with Python's cyclic collector
paused, as the CLI's opt-in fast start does (``experiments/collector.py``): what is left is the framework's own
start (Lightning, this package, the config, the set-up).

Each job runs ``--repeats`` times (default 3), each time in fresh processes; a figure takes each
side's best run (the least disturbed, as ``timeit`` does) and every run's numbers are kept in its
details. Other processes' load distorts wall times: on the shared 2-core development machine the same
bare loop's mean round varied from 0.25 to 0.40 s between runs, with every phase of a round slowed
together. So with one thread and at least two cores the bare loop and the framework run AT THE SAME
TIME, each pinned to its own core (the cores swap between repeats): a slow moment slows both. With
more threads they alternate. Start-up is timed in a process of its own (the framework stopped at its
first client), each reference right after it, both from spawning the process to the moment in question
(the reference's imports done, not its exit). Each figure also gives the ratio of CPU seconds
(``time.process_time`` of each process at that moment), and the load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._timing import figure

__all__ = ["run", "engine_config", "MODELS", "ROUND_BOUND", "START_BOUND"]

ROUND_BOUND = 1.15  # framework round / bare round: the engine costs at most 15 % more than the work
START_BOUND = 1.15  # process start → first client / `python -c "import torch, timm"`

# timm resnet18 overrides: "small" is a 327 k-parameter model (with BatchNorm buffers), "large" a
# real ResNet-18's depth at half its width (2.8 M parameters, ~10x)
MODELS: dict[str, dict[str, Any]] = {
    "small": {"layers": [1, 1, 1, 1], "channels": [16, 32, 64, 128], "stem_width": 16},
    "large": {"layers": [2, 2, 2, 2], "channels": [32, 64, 128, 256], "stem_width": 32},
    "tiny": {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8},  # --quick
}
_REPO = Path(__file__).resolve().parents[1]


DIGITS_MAX_CLIENTS = 100  # above this, digits' 1,437 training images are too few (see engine_config)
_SHARD = 8  # K > DIGITS_MAX_CLIENTS: images per shard; 2 shards a client


def engine_config(
    *, output_dir: str, model: str = "small", num_clients: int = 50, per_round: int = 10, rounds: int = 30
) -> dict[str, Any]:
    """The job as a config mapping (the YAML's shape).

    Up to :data:`DIGITS_MAX_CLIENTS` clients: the bundled digits, Dirichlet α = 0.5. More clients cannot
    share digits' 1,437 training images (a one-image client's batch of one also fails the ResNet's
    BatchNorm on its 1×1 last feature map), so the large-K job is the generated ``synthetic`` data set
    with 16 training images per client in McMahan et al.'s shards (2 of 8 images, sorted by label, dealt
    at random: every client's one batch holds 16 images) and its test split of a quarter of that size."""
    data: dict[str, Any] = {"name": "digits", "image_size": 16, "batch_size": 32}
    partition: dict[str, Any] = {"num_clients": num_clients, "alpha": 0.5}
    if num_clients > DIGITS_MAX_CLIENTS:
        data = {**data, "name": "synthetic", "num_samples": 2 * _SHARD * num_clients}
        partition = {"num_clients": num_clients, "scheme": "shards", "shards_per_client": 2}
    return {
        "algorithm": "fedavg_cnn",
        "seed": 0,
        "output_dir": output_dir,
        "run_name": f"engine_{model}_k{num_clients}",
        "data": data,
        "partition": partition,
        "federation": {"accelerator": "cpu", "rounds": rounds, "client_fraction": per_round / num_clients},
        "train": {"epochs": 1, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 32},
        "model": {"library": "timm", "name": "resnet18", "pretrained": None, "overrides": MODELS[model]},
        "logging": {"progress": False},
    }


# -- the workers (each in a fresh process) ----------------------------------------------------------------
class _RoundClock:
    """Wall time of each round, from its start to the next round's start (the last: to the end of the
    rounds, ``on_rounds_end``, once its checkpoint is durable), the end-of-run reports after it, and the
    moment the first client starts (seconds since the epoch, for the start-up figure)."""

    def __init__(self) -> None:
        self.starts: list[tuple[float, float]] = []  # (wall, process CPU)
        self.first_client: tuple[float, float] | None = None  # (seconds since the epoch, process CPU seconds)
        self.accuracy: list[float] = []
        self.report_s = 0.0  # on_rounds_end → on_run_end: partition.png, summary.json, the loggers' end

    def on_round_start(self, **_: Any) -> None:
        self.starts.append((time.perf_counter(), time.process_time()))

    def on_client_start(self, **_: Any) -> None:
        if self.first_client is None:
            self.first_client = (time.time(), time.process_time())

    def on_round_end(self, *, metrics: dict[str, Any], **_: Any) -> None:
        self.accuracy.append(float(metrics["accuracy"]))

    def on_rounds_end(self, **_: Any) -> None:
        self.starts.append((time.perf_counter(), time.process_time()))

    def on_run_end(self, **_: Any) -> None:
        self.report_s = time.perf_counter() - self.starts[-1][0]


def _framework_worker(config: Path, out: Path, paused: Any = None) -> None:
    from fl_lightning.config.loading import load_config
    from fl_lightning.federation.simulation import Simulation

    clock = _RoundClock()
    cfg = load_config(config)
    Simulation(cfg=cfg, callbacks=[clock, *([paused] if paused is not None else [])]).run()
    pairs = list(zip(clock.starts, clock.starts[1:]))
    out.write_text(
        json.dumps(
            {
                "round_s": [b[0] - a[0] for a, b in pairs],
                "round_cpu_s": [b[1] - a[1] for a, b in pairs],
                "accuracy": clock.accuracy,
                "first_client_epoch_s": clock.first_client[0],
                "first_client_cpu_s": clock.first_client[1],
                "report_s": clock.report_s,
            }
        ),
        encoding="utf-8",
    )


class _FirstClient(Exception):
    """Raised at the first client to end a start-up measurement there."""


class _StopAtFirstClient:
    def __init__(self) -> None:
        self.at: tuple[float, float] | None = None

    def on_client_start(self, **_: Any) -> None:
        self.at = (time.time(), time.process_time())
        raise _FirstClient


def _start_worker(config: Path, out: Path, paused: Any = None) -> None:
    """The framework from process start to its first client, then stop (the start-up figure)."""
    from fl_lightning.config.loading import load_config
    from fl_lightning.federation.simulation import Simulation

    stop = _StopAtFirstClient()
    with contextlib.suppress(_FirstClient):  # the run ends at its first client, by design
        Simulation(cfg=load_config(config), callbacks=[*([paused] if paused is not None else []), stop]).run()
    out.write_text(json.dumps({"first_client_epoch_s": stop.at[0], "first_client_cpu_s": stop.at[1]}), encoding="utf-8")


def _bare_worker(config: Path, out: Path) -> None:
    """The job as one plain PyTorch loop (see the module docstring)."""
    import numpy as np
    import timm
    import torch
    import torch.nn.functional as F
    import yaml
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torchvision.transforms import v2

    from fl_lightning.data.partition import dirichlet_partition, shard_partition
    from fl_lightning.federation.ranks.placement import client_seed, sample_clients

    values = yaml.safe_load(config.read_text(encoding="utf-8"))
    seed, data, part, fed, train = (values["seed"], values["data"], values["partition"], values["federation"], values["train"])
    if data["name"] == "digits":
        digits = load_digits()
        gray = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
        images = torch.from_numpy(gray)[:, None].expand(-1, 3, -1, -1).contiguous()  # (N, 3, 8, 8) uint8
        targets = np.asarray(digits.target, dtype=np.int64)
        train_idx, test_idx = (
            np.sort(i) for i in train_test_split(np.arange(len(targets)), test_size=0.2, random_state=seed, stratify=targets)
        )
        raw_train, raw_test = images[train_idx], images[test_idx]
        t_train, t_test = targets[train_idx], targets[test_idx]
    else:  # the generated images (a pure function of the seed), untransformed
        from fl_lightning.data.registry import build_dataset

        generated = build_dataset("synthetic", root=".", seed=seed, num_samples=data["num_samples"])
        raw_train, raw_test = generated.train.images, generated.test.images
        t_train, t_test = generated.train_targets, generated.test_targets
    size = data["image_size"]
    prep = v2.Compose(
        [
            v2.Resize(size, antialias=True),
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    x_train = torch.stack([prep(x) for x in raw_train])  # once: (N_train, 3, S, S)
    x_test = torch.stack([prep(x) for x in raw_test])
    y_train, y_test = torch.from_numpy(t_train), torch.from_numpy(t_test)
    if part.get("scheme") == "shards":
        parts = shard_partition(t_train, part["num_clients"], part["shards_per_client"], seed=0)
    else:
        parts = dirichlet_partition(t_train, part["num_clients"], part["alpha"], seed=0, min_samples=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = timm.create_model(values["model"]["name"], pretrained=False, num_classes=10, **values["model"]["overrides"])
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batch = train["batch_size"]
    round_s, round_cpu_s, accuracy = [], [], []
    for t in range(fed["rounds"]):
        start, cpu = time.perf_counter(), time.process_time()
        sums: dict[str, torch.Tensor] = {}
        total = 0.0
        for c in sample_clients(part["num_clients"], fed["client_fraction"], seed=0, round_idx=t):
            idx = torch.from_numpy(parts[c])
            cs = client_seed(seed, t, c)
            torch.default_generator.manual_seed(cs)
            model.load_state_dict(state)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=train["lr"], momentum=train["momentum"], weight_decay=0.0)
            g = torch.Generator().manual_seed(cs)
            torch.empty((), dtype=torch.int64).random_(generator=g)  # what a DataLoader iterator draws first
            perm = idx[torch.randperm(len(idx), generator=g)]
            for i in range(0, len(perm), batch):
                b = perm[i : i + batch]
                loss = F.cross_entropy(model(x_train[b]), y_train[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            n = float(len(idx))
            for k, v in model.state_dict().items():  # the float64 weighted mean, folded in client order
                term = v.detach().to(torch.float64) * n
                if k in sums:
                    sums[k] += term
                else:
                    sums[k] = term
            total += n
        state = {
            k: (s / total if v.is_floating_point() else (s / total).round()).to(v.dtype)
            for (k, s), v in zip(sums.items(), state.values())
        }
        model.load_state_dict(state)
        model.eval()
        correct = 0
        with torch.inference_mode():
            for i in range(0, len(x_test), data["batch_size"]):
                correct += int((model(x_test[i : i + data["batch_size"]]).argmax(1) == y_test[i : i + data["batch_size"]]).sum())
        accuracy.append(correct / len(y_test))
        round_s.append(time.perf_counter() - start)
        round_cpu_s.append(time.process_time() - cpu)
    out.write_text(
        json.dumps({"round_s": round_s, "round_cpu_s": round_cpu_s, "accuracy": accuracy, "test_size": len(y_test)}),
        encoding="utf-8",
    )


# -- the suite --------------------------------------------------------------------------------------------
def _env(threads: int) -> dict[str, str]:
    """The workers' environment: ``threads`` torch threads, offline, and Python's bytecode cache on as on
    any ordinary installation (a machine that sets PYTHONDONTWRITEBYTECODE would otherwise compile this
    package's sources in every fresh process, ~0.2 s, while the reference imports come precompiled)."""
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def _python(args: list[str], threads: int) -> tuple[float, float]:
    """Run ``python args`` in a fresh process; returns its wall time and CPU seconds (a failure is an error)."""
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(threads), cwd=_REPO)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(args[:4])} ... exited {proc.returncode}: {proc.stderr[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _imports_done(code: str, threads: int) -> tuple[float, float]:
    """Seconds from spawning ``python -c code`` to the end of its imports, and the CPU seconds by then: the
    process prints both as its last act, so the interpreter's exit (tearing torch down takes ~1 s) is not
    counted — as the framework's figure stops at its first client, not at its exit."""
    spawned = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", f"{code}; import time; print(time.time(), time.process_time())"],
        capture_output=True,
        text=True,
        env=_env(threads),
        cwd=_REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -c {code!r} exited {proc.returncode}: {proc.stderr[-3000:]}")
    done, cpu = (float(v) for v in proc.stdout.split()[-2:])
    return done - spawned, cpu


def _worker(kind: str, config: Path, out: Path, threads: int) -> tuple[dict[str, Any], float, float]:
    spawned = time.time()
    wall, _ = _python(["-m", "benchmarks.engine", "--worker", kind, str(config), str(out), str(threads)], threads)
    return json.loads(out.read_text(encoding="utf-8")), wall, spawned


_CORE_VARIABLE = "FL_ENGINE_BENCH_CORE"


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _pair_at_once(config: Path, folder: Path, r: int) -> tuple[tuple[dict[str, Any], float], tuple[dict[str, Any], float]]:
    """Bare loop and framework at the same time, one torch thread each, each pinned to its own core (the
    cores swap from one repeat to the next): whatever else the machine does at that moment, both see it."""
    cores = _cores()[:2]
    if r % 2:
        cores.reverse()
    procs, started = {}, time.perf_counter()
    for kind, core in zip(("bare", "framework"), cores):
        env = {**_env(1), _CORE_VARIABLE: str(core)}
        procs[kind] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.engine", "--worker", kind, str(config), str(folder / f"{kind}{r}.json"), "1"],
            env=env,
            cwd=_REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for kind, proc in procs.items():
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the {kind} worker exited {proc.returncode}: {err[-3000:]}")
        results[kind] = (json.loads((folder / f"{kind}{r}.json").read_text(encoding="utf-8")), time.perf_counter() - started)
    return results["bare"], results["framework"]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _job_config(work: Path, name: str, **job: Any) -> Path:
    import yaml

    folder = work / name
    folder.mkdir(parents=True)
    config = folder / "job.yaml"
    config.write_text(yaml.safe_dump(engine_config(output_dir=str(folder / "runs"), **job), sort_keys=False), encoding="utf-8")
    return config


def _check_same_accuracy(name: str, fw: dict[str, Any], bare: dict[str, Any]) -> None:
    n = bare["test_size"]
    wrong = [t for t, (a, b) in enumerate(zip(fw["accuracy"], bare["accuracy"])) if round(a * n) != round(b * n)]
    if wrong or len(fw["accuracy"]) != len(bare["accuracy"]):
        raise RuntimeError(
            f"{name}: the framework and the bare loop disagree on the test accuracy of rounds {wrong} "
            f"(framework {fw['accuracy']}, bare {bare['accuracy']})"
        )


_DATA_LIBRARY = "sklearn.datasets, sklearn.model_selection"
_START_REFERENCES = (
    ("start_ratio", "import torch, timm", "`import torch, timm`"),
    (
        "start_ratio_with_data_library",
        f"import torch, timm, {_DATA_LIBRARY}",
        "`import torch, timm` + scikit-learn (the digits' library)",
    ),
    # the CLI's opt-in fast start pauses the cyclic collector (experiments/collector.py); this
    # reference does too, so that the figure shows what is left once both import alike
    (
        "start_ratio_with_data_library_collector_paused",
        f"import gc; gc.disable(); import torch, timm, {_DATA_LIBRARY}",
        "the same imports with the collector paused, as the framework's start does",
    ),
)


def _point(
    work: Path, name: str, threads: int, repeats: int = 3, *, time_imports: bool = False, concurrent: bool = True, **job: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Framework and bare loop on one job, ``repeats`` fresh processes each; their accuracies must agree
    in every round of every run. The figure compares each side's best mean round. With one thread and
    two cores (and ``concurrent``) each repeat runs the two at once, one core each; otherwise one after
    the other. ``time_imports``: each repeat also times the start-up (alone) and its references."""
    config = _job_config(work, name, **job)
    folder = config.parent
    at_once = threads == 1 and len(_cores()) >= 2 and concurrent
    bares, fws, starts, imports = [], [], [], {key: [] for key, _, _ in _START_REFERENCES}
    for r in range(repeats):
        shutil.rmtree(folder / "runs", ignore_errors=True)  # each framework run starts afresh, not a resume
        if at_once:
            (bare, bare_wall), (fw, fw_wall) = _pair_at_once(config, folder, r)
        else:
            bare, bare_wall, _ = _worker("bare", config, folder / f"bare{r}.json", threads)
            shutil.rmtree(folder / "runs", ignore_errors=True)
            fw, fw_wall, spawned = _worker("framework", config, folder / f"framework{r}.json", threads)
            starts.append((fw["first_client_epoch_s"] - spawned, fw["first_client_cpu_s"]))
        _check_same_accuracy(name, fw, bare)
        bares.append({**bare, "process_s": bare_wall})
        fws.append({**fw, "process_s": fw_wall})
        if time_imports and at_once:  # start-up alone on the machine, not beside a bare loop
            shutil.rmtree(folder / "runs", ignore_errors=True)
            first, _, spawned = _worker("start", config, folder / f"start{r}.json", threads)
            starts.append((first["first_client_epoch_s"] - spawned, first["first_client_cpu_s"]))
        for key, code, _ in _START_REFERENCES if time_imports else ():
            if "sklearn" in code and job.get("num_clients", 50) > DIGITS_MAX_CLIENTS:
                continue  # the generated data set needs no scikit-learn
            imports[key].append(_imports_done(code, threads))
    fw_means = [_mean(f["round_s"]) for f in fws]
    bare_means = [_mean(b["round_s"]) for b in bares]
    fw_cpu = [_mean(f["round_cpu_s"]) for f in fws]
    bare_cpu = [_mean(b["round_cpu_s"]) for b in bares]
    ratio, cpu_ratio = min(fw_means) / min(bare_means), min(fw_cpu) / min(bare_cpu)
    best_fw, best_bare = fws[fw_means.index(min(fw_means))], bares[bare_means.index(min(bare_means))]
    details = {
        "threads": threads,
        **job,
        "repeats": repeats,
        "framework_mean_round_s": min(fw_means),
        "bare_mean_round_s": min(bare_means),
        "framework_mean_round_s_runs": fw_means,
        "bare_mean_round_s_runs": bare_means,
        "median_ratio_of_runs": statistics.median(f / b for f, b in zip(fw_means, bare_means)),
        "overhead_per_round_ms": 1e3 * (min(fw_means) - min(bare_means)),
        "cpu_ratio": cpu_ratio,
        "framework_mean_round_cpu_s": min(fw_cpu),
        "bare_mean_round_cpu_s": min(bare_cpu),
        "framework_process_s": [f["process_s"] for f in fws],
        "bare_process_s": [b["process_s"] for b in bares],
        "framework_round_s": best_fw["round_s"],
        "bare_round_s": best_bare["round_s"],
        "accuracy": best_fw["accuracy"],
        "concurrent": at_once,
        "first_client_s": min(w for w, _ in starts) if starts else None,
        "framework_report_s": [f["report_s"] for f in fws],
        "first_client_cpu_s": min(c for _, c in starts) if starts else None,
        "imports": imports,
    }
    runs = ", ".join(f"{f:.3f}/{b:.3f}" for f, b in zip(fw_means, bare_means))
    fig = figure(
        ratio,
        "x",
        op="<=",
        bound=ROUND_BOUND,
        details=details,
        note=f"{threads} thread(s){', run side by side, one core each' if at_once else ''}; best mean round "
        f"{min(fw_means):.3f} s vs bare {min(bare_means):.3f} s, "
        f"{1e3 * (min(fw_means) - min(bare_means)):+.1f} ms a round "
        f"(each run, framework/bare: {runs}; CPU-time ratio {cpu_ratio:.3f}); end-of-run reports "
        f"{min(details['framework_report_s']):.2f} s once, not in a round; same accuracy in all "
        f"{len(best_bare['accuracy'])} rounds of every run",
    )
    return fig, details


def _start_figures(details: dict[str, Any]) -> dict[str, Any]:
    """Process start → first client against the imports' own cost (each side's best of the repeats, the
    references timed right after each framework run)."""
    out = {}
    first_client_s, first_client_cpu_s = details["first_client_s"], details["first_client_cpu_s"]
    for key, code, what in _START_REFERENCES:
        runs = details["imports"].get(key)
        if not runs:
            continue
        wall, cpu = min(w for w, _ in runs), min(c for _, c in runs)
        out[key] = figure(
            first_client_s / wall,
            "x",
            op="<=",
            bound=START_BOUND,
            details={
                "first_client_s": first_client_s,
                "imports_s": wall,
                "imports": code,
                "first_client_cpu_s": first_client_cpu_s,
                "imports_cpu_s": cpu,
                "cpu_ratio": first_client_cpu_s / cpu,
                "imports_runs": runs,
            },
            note=f"process start → first client {first_client_s:.2f} s vs {what} {wall:.2f} s (best of "
            f"{len(runs)} each, alternating); CPU seconds {first_client_cpu_s:.2f} vs {cpu:.2f} "
            f"({first_client_cpu_s / cpu:.3f}x)",
        )
    return out


def run(
    *, quick: bool, device: Any = None, threads: Sequence[int] = (1, 2), model: str = "small", clients: int = 50, repeats: int = 3
) -> dict[str, Any]:
    """The engine figures (see the module docstring); ``quick``: a tiny model, 3 rounds, one run each
    (the machinery only)."""
    model = "tiny" if quick else model
    rounds, repeats = (3, 1) if quick else (30, repeats)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fl_engine_bench_") as tmp:
        work = Path(tmp)
        for i, n in enumerate(threads):
            fig, details = _point(
                work, f"{model}_k{clients}_t{n}", n, repeats, time_imports=i == 0, model=model, num_clients=clients, rounds=rounds
            )
            results[f"round_ratio_{model}_k{clients}_t{n}"] = fig
            if i == 0:
                results.update(_start_figures(details))
    results["sizes"] = {
        "model": model,
        "overrides": MODELS[model],
        "clients": clients,
        "per_round": 10,
        "rounds": rounds,
        "threads": list(threads),
        "repeats": repeats,
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "CONFIG", "OUT", "THREADS"), required=True)
    args = parser.parse_args(argv)
    kind, config, out, threads = args.worker
    core = os.environ.get(_CORE_VARIABLE)
    if core is not None:  # a concurrent pair: each worker on its own core
        os.sched_setaffinity(0, {int(core)})
    if kind == "bare":
        import torch

        torch.set_num_threads(int(threads))
        _bare_worker(Path(config), Path(out))
        return 0
    from fl_lightning.experiments.startup import fast_start, fast_start_requested

    # what fl_lightning.train's main does first, before it imports torch (opt-in: FL_LIGHTNING_FAST_START=1)
    paused = fast_start() if fast_start_requested() else None
    import torch

    torch.set_num_threads(int(threads))
    {"framework": _framework_worker, "start": _start_worker}[kind](Path(config), Path(out), paused)
    return 0


if __name__ == "__main__":
    sys.exit(main())
