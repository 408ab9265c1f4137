"""Every rank works: a tiny FeDiSyn, DENSE and FedAvg on 1, 2 and 4 CPU processes.

``python -m benchmarks ranks`` runs each tiny config (``conf/fedisyn_tiny.yaml``,
``conf/dense_digits_tiny.yaml``, ``conf/fedavg_digits_tiny.yaml``) with ``--federation.devices`` 1, 2 and 4
(gloo, one torch thread per process) and reports, per method and process count:

* ``wall_s`` — rank 0's time from ``on_run_start`` to ``on_run_end`` (the rounds, not the start-up);
* ``wait_share_max`` — the largest share of that time any rank spent blocked in the engine's collectives
  (``collectives.waiting``: the plan, the records, the server's phases, the round's end), the issue's goal being
  ≤ 20 % where the work can be split;
* ``waits`` — each rank's seconds in each kind of collective (``round's aggregate and evaluation`` on rank 1 is
  the time rank 0 worked alone on it; ``the test split's evaluation`` is a phase every rank shares).

On a machine without the cores (two shared here) the wall times of 2 and 4 processes say little; the waiting
shares and the per-phase split do not need the cores.

Each run also records its phases' own wall seconds (``fl_lightning/phase_times.py``). From the 1-process run, the
per-phase model (``benchmarks/rank_model.py``) estimates each phase on 2 and 4 processes; the estimate is printed
next to what those runs measured (the busiest rank's seconds in each phase), the model checked against measurement.
``--model-from FILE.json`` (one GPU's phase times with their assumptions, e.g. ``benchmarks/data/
fedisyn_food101_h100.json``) prints the estimate for 1, 2, 4 and 8 ranks and runs nothing. Each run is a fresh process:
``python -m benchmarks.ranks --worker --config ... --out ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._timing import bytes_written, figure
from benchmarks.rank_model import NVLINK_BYTES_PER_S, Phase, estimate, format_estimate, phases_from_json

__all__ = ["run", "METHODS", "measured_phases", "model_from"]

_REPO = Path(__file__).resolve().parents[1]
_CONF = _REPO / "conf"
# the tiny configs of the three methods the issue names, with the overrides that keep each run to seconds
_GPTFL = (
    "--gptfl.pretrain_overrides",
    "{img_size: 32, patch_size: 8, embed_dim: 384, depth: 6, num_heads: 6, global_pool: avg}",
    "--gptfl.pretrain_epochs",
    "1",
    "--federation.rounds",
    "2",
    "--train.epochs",
    "1",
)
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    # 60 images: batches of 8 (8 of them) so that generation has batches to deal, as a real run's ~19k images do
    "fedisyn": ("fedisyn_tiny.yaml", ("--fedisyn.generation_batch_size", "8")),
    "dense": ("dense_digits_tiny.yaml", ("--dense.epochs", "5")),  # the server's distillation: 5 of its 30 epochs
    "fedavg": ("fedavg_digits_tiny.yaml", ("--federation.rounds", "3", "--partition.num_clients", "8")),
    # GPT-FL fine-tuning a 10.7 M-parameter ViT (43 MB a client's upload), its uploads folded on the ranks that train
    # them (federation/ranks/summed_uploads.py) and, as before, a record per client that rank 0 reads back and folds
    "gptfl": ("gptfl_tiny.yaml", (*_GPTFL, "--partition.num_clients", "8")),
    "gptfl_records": ("gptfl_tiny.yaml", (*_GPTFL, "--partition.num_clients", "8", "--federation.record_after_s", "0")),
}
DEFAULT_METHODS = ("fedisyn", "dense", "fedavg")  # ``--methods`` adds the others


# how each recorded phase is dealt over the ranks (docs/ranks.md "Phases"); DENSE's server is not modelled (its split
# ensemble: rank0, an upper bound) and its evaluation is not shared
_RULES: dict[str, dict[str, str]] = {
    "fedisyn": {"aggregate": "rank0", "evaluation": "blocks"},
    "dense": {"aggregate": "rank0", "evaluation": "rank0"},
    "fedavg": {"aggregate": "rank0", "evaluation": "blocks"},
    "gptfl": {"aggregate": "rank0", "evaluation": "blocks"},
    "gptfl_records": {"aggregate": "rank0", "evaluation": "blocks"},
}
GLOO_BYTES_PER_S = 1e9  # the CPU processes' all-reduce bandwidth the model assumes (gloo over loopback; an assumption)


def measured_phases(report: dict[str, Any], method: str) -> list[Phase]:
    """The :class:`Phase` list of one rank's report (``rank0.json`` of a 1-process run), each with its rule."""
    phases, facts, calls = [], report["facts"], report["calls"]
    for name, seconds in report["phases"].items():
        if name == "clients":
            rounds = tuple({int(c): s for c, s in r.items()} for r in report["items"]["clients"])
            phases.append(Phase(name, seconds, "clients", rounds=rounds, client_sizes=tuple(report["client_sizes"])))
        elif name == "pilots":
            pilots = report["items"].get("pilot", [])
            phases.append(Phase(name, seconds, "pilots", items=max(len(pilots), 1), rounds=(dict(enumerate(pilots)),)))
        elif name == "generation":
            phases.append(Phase(name, seconds, "strided", items=int(facts.get("generation batches", 1))))
        elif name == "store":
            phases.append(Phase(name, seconds, "blocks", items=int(facts.get("store rows", 1))))
        elif name == "pretraining":
            steps, grad = int(facts.get("pretraining steps", 0)), facts.get("pretraining gradient bytes", 0.0)
            phases.append(Phase(name, seconds, "data_parallel", steps=steps, gradient_bytes=grad))
        else:
            rule = _RULES[method].get(name, "rank0")
            n = round(facts.get(f"{name} batches", 0) / max(calls.get(name, 1), 1)) if rule == "blocks" else 1
            phases.append(Phase(name, seconds, rule, items=max(n, 1)))
    return phases


def _model_lines(method: str, one: dict[str, Any], points: dict[str, Any], counts: Sequence[int]) -> dict[str, Any]:
    """The model's estimate of each process count from the 1-process run, next to the measured phases."""
    phases = measured_phases(one, method)
    out: dict[str, Any] = {}
    for p in counts:
        est = estimate(phases, p, bandwidth=GLOO_BYTES_PER_S)
        ranks = points[f"{method}_p{p}"]["ranks"]
        measured = {ph.name: max(r["phases"].get(ph.name, 0.0) for r in ranks) for ph in est.phases}
        rows = {ph.name: {"model_s": round(ph.seconds, 3), "measured_s": round(measured[ph.name], 3)} for ph in est.phases}
        out[p] = {"model_total_s": est.total_s, "measured_total_s": sum(measured.values()), "phases": rows}
        print(f"ranks {method} processes={p}: model vs measured (busiest rank) per phase:", file=sys.stderr)
        for name, row in rows.items():
            print(f"  {name:<12} model {row['model_s']:>8.3f} s   measured {row['measured_s']:>8.3f} s", file=sys.stderr)
    return out


class _RankReport:
    """A callback writing this rank's wall time, waits (from the installed :class:`WaitLog`) and phase times (from
    the installed :class:`PhaseLog`, with each client's seconds of every round) at the run's end."""

    def __init__(self, out: Path, log: Any, phases: Any) -> None:
        self.out, self.log, self.phases, self.start, self.before = out, log, phases, 0.0, {}
        self.phases_before: dict[str, float] = {}
        self.clients: list[list[float]] = []

    def on_run_start(self, **_: Any) -> None:
        self.start, self.before = time.monotonic(), dict(self.log.seconds)  # the start-up's waits are not counted
        self.written = bytes_written()
        self.phases_before = dict(self.phases.seconds)

    def on_round_end(self, *, results: Any, **_: Any) -> None:
        self.clients.append({str(c): s for c, s in sorted(results.compute_s.items())})  # every rank's clients

    def on_run_end(self, *, run_dir: Path, **_: Any) -> None:
        import csv

        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        waits = {k: v - self.before.get(k, 0.0) for k, v in self.log.seconds.items()}
        phases = {k: v - self.phases_before.get(k, 0.0) for k, v in self.phases.seconds.items()}
        report = {
            "wall_s": time.monotonic() - self.start,
            "bytes_written": bytes_written() - self.written,  # files (records, server.pt…) and sockets (gloo)
            "waits": {k: v for k, v in waits.items() if v > 0},
            "phases": {k: v for k, v in phases.items() if v > 0},
            "items": {**self.phases.items, "clients": self.clients},
            "facts": dict(self.phases.facts),
            "calls": dict(self.phases.calls),
        }
        with (Path(run_dir) / "partition.csv").open(encoding="utf-8") as f:  # the data sizes clients are placed by
            report["client_sizes"] = [int(row["total"]) for row in csv.DictReader(f)]
        (self.out / f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


def _worker(config: str, overrides: Sequence[str], out: Path) -> None:
    from fl_lightning.config.loading import load_config
    from fl_lightning.federation.ranks.collectives import recording_waits
    from fl_lightning.federation.simulation import Simulation
    from fl_lightning.phase_times import recording_phases

    with recording_waits() as log, recording_phases() as phases:
        cfg = load_config(config, list(overrides))
        Simulation(cfg=cfg, loggers=[], callbacks=[_RankReport(out, log, phases)]).run()


def _point(work: Path, method: str, processes: int) -> dict[str, Any]:
    """One run of ``method`` on ``processes`` CPU processes: wall time, each rank's waits and share."""
    name, extra = METHODS[method]
    out = work / f"{method}_p{processes}"
    out.mkdir()
    overrides = [
        "--output_dir",
        str(work / "runs" / f"{method}_p{processes}"),
        "--logging.progress",
        "false",
        "--federation.devices",
        str(processes),
        *extra,
    ]
    path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)  # a checkout works
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    command = [
        sys.executable,
        "-m",
        "benchmarks.ranks",
        "--worker",
        "--config",
        str(_CONF / name),
        "--out",
        str(out),
        "--",
        *overrides,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=_REPO, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"bench ranks: {method} on {processes} processes failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(processes)]
    wall = ranks[0]["wall_s"]
    shares = [sum(r["waits"].values()) / max(r["wall_s"], 1e-9) for r in ranks]
    return {
        "wall_s": wall,
        "wait_share": shares,
        "wait_share_max": max(shares),
        "bytes_written": sum(r["bytes_written"] for r in ranks),
        "waits": [{k: round(v, 3) for k, v in sorted(r["waits"].items())} for r in ranks],
        "ranks": ranks,
    }


def run(
    *,
    quick: bool,
    device: torch.device | None = None,
    processes: Sequence[int] = (1, 2, 4),
    methods: Sequence[str] = DEFAULT_METHODS,
    work_dir: Path | None = None,
    model_from: Path | None = None,
) -> dict[str, Any]:
    """Every figure of the suite (see the module docstring); CPU processes whatever ``device``.

    Args:
        quick: 1 and 2 processes only.
        device: ignored (gloo CPU processes); accepted for the common runner signature.
        processes: the process counts.
        methods: keys of :data:`METHODS` (default :data:`DEFAULT_METHODS`).
        work_dir: where the runs go (default: a temporary folder, removed afterwards).
        model_from: a JSON of one GPU's phase times: print the model's estimate for 1, 2, 4 and 8 ranks
            (:func:`model_from`) and run nothing.
    """
    if model_from is not None:
        return model_from_file(model_from)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        from fl_lightning.errors import UsageError

        raise UsageError(f"ranks: no method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    counts = [p for p in processes if not quick or p <= 2]
    work = Path(tempfile.mkdtemp(prefix="fl_bench_ranks_", dir=work_dir))
    results: dict[str, Any] = {}
    points: dict[str, Any] = {}
    try:
        for method in methods:
            for p in counts:
                points[f"{method}_p{p}"] = point = _point(work, method, p)
                shown = {k: v for k, v in point.items() if k != "ranks"}
                print(f"ranks {method} processes={p}: {json.dumps(shown)}", file=sys.stderr, flush=True)
                results[f"{method}_p{p}_wall_s"] = figure(point["wall_s"], "s", note="rank 0, the rounds")
                results[f"{method}_p{p}_bytes_written"] = figure(
                    point["bytes_written"] / 1e6,
                    "MB",
                    note="write(2) bytes of every rank through the rounds: files, and gloo's sockets on several processes",
                )
                if p > 1:
                    results[f"{method}_p{p}_wait_share_max"] = figure(
                        100.0 * point["wait_share_max"],
                        "%",
                        op="<=",
                        bound=20.0,
                        note="the most any rank waited in collectives",
                        details=point,
                    )
        if 1 in counts and len(counts) > 1:
            _add_model(results, points, methods, [p for p in counts if p > 1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["sizes"] = {"methods": list(methods), "processes": counts, "points": points}
    return results


def _add_model(results: dict[str, Any], points: dict[str, Any], methods: Sequence[str], counts: Sequence[int]) -> None:
    """The model's estimate of each process count from each method's 1-process run, as figures (information)."""
    print(
        "the per-phase model against CPU processes (gloo all-reduce assumed at "
        f"{GLOO_BYTES_PER_S / 1e9:g} GB/s); on 2 shared cores the wall times of 2 and 4 processes say little",
        file=sys.stderr,
    )
    for method in methods:
        one = points[f"{method}_p1"]["ranks"][0]
        for p, row in _model_lines(method, one, points, counts).items():
            results[f"{method}_p{p}_model_s"] = figure(
                row["model_total_s"],
                "s",
                note=f"the model from 1 process; measured {row['measured_total_s']:.3g} s (the phases' busiest ranks)",
                details=row,
            )


def _estimates(
    phases: Sequence[Phase], ranks: Sequence[int], bandwidth: float, lines: list[str], results: dict[str, Any], *, suffix: str
) -> None:
    """Each N's estimate of ``phases``: its lines onto ``lines``, its figures (``model_n<N>_speedup<suffix>``, the
    most any rank waits) into ``results``."""
    for n in ranks:
        est = estimate(phases, n, bandwidth=bandwidth)
        lines += format_estimate(est)
        per_phase = {p.name: {"one_rank_s": p.one_rank_s, "seconds": p.seconds} for p in est.phases}
        details = {"phases": per_phase, "wait_share": list(est.wait_share), "total_s": est.total_s}
        goal = {"op": ">=", "bound": 5.5} if n == 8 else {}  # the goal: FeDiSyn Food-101 >= 5.5x on 8 GPUs
        note = f"{n} rank(s), the per-phase model" + (", pilot_ranks: all" if suffix else "")
        results[f"model_n{n}_speedup{suffix}"] = figure(est.speedup, "x", note=note, details=details, **goal)
        results[f"model_n{n}_wait_share_max{suffix}"] = figure(100 * max(est.wait_share), "%", op="<=", bound=20.0)


def model_from(data: dict[str, Any], ranks: Sequence[int] = (1, 2, 4, 8)) -> tuple[list[str], dict[str, Any]]:
    """The model's estimate for ``ranks`` from one GPU's phase times (``data``: the JSON of ``--model-from``):
    the printed lines (its assumptions, each phase's source, each estimate) and the figures."""
    bandwidth = float(data.get("assumptions", {}).get("allreduce_bytes_per_s", {}).get("value", NVLINK_BYTES_PER_S))
    lines = [str(data.get("name", "phases")), str(data.get("note", "")), "assumptions:"]
    for key, entry in data.get("assumptions", {}).items():
        lines.append(f"  {key} = {entry['value']} ({entry.get('kind', '?')}: {entry.get('source', 'no source')})")
    lines.append("phases (one GPU):")
    for p in data["phases"]:
        lines.append(f"  {p['name']} = {p['seconds']} s, {p['rule']} ({p.get('kind', '?')}: {p.get('source', 'no source')})")
    phases = phases_from_json(data)
    results: dict[str, Any] = {}
    _estimates(phases, ranks, bandwidth, lines, results, suffix="")
    if any(p.rule == "pilots" for p in phases):  # the same run under pilot_ranks: all
        lines.append("with pilot_ranks: all (each pilot over all the ranks, sped up as the other phases together):")
        every = [dataclasses.replace(p, rule="pilots_all") if p.rule == "pilots" else p for p in phases]
        _estimates(every, [n for n in ranks if n > 1], bandwidth, lines, results, suffix="_pilots_all")
    if len(phases) > 1:  # what the longest phase costs: the same estimate without it
        n = max(ranks)
        longest = max(estimate(phases, n, bandwidth=bandwidth).phases, key=lambda p: p.seconds).name
        rest = estimate([p for p in phases if p.name != longest], n, bandwidth=bandwidth)
        lines.append(f"without {longest} on {n} ranks: {rest.one_rank_s:.4g} s -> {rest.total_s:.4g} s, {rest.speedup:.2f}x")
    return lines, results


def model_from_file(path: Path) -> dict[str, Any]:
    """:func:`model_from` of a JSON file, its lines printed; a missing or malformed file is one line (exit 2)."""
    from fl_lightning.errors import UsageError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        lines, results = model_from(data)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"--model-from {path}: {type(err).__name__}: {err}") from None
    print("\n".join(lines), flush=True)
    results["sizes"] = {"model_from": str(path)}
    return results


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ranks")
    parser.add_argument("--worker", action="store_true", help="run one configuration (the suite's own processes)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    _worker(args.config, args.overrides, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
