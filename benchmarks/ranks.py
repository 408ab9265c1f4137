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
shares and the per-phase split do not need the cores. Each run is a fresh process:
``python -m benchmarks.ranks --worker --config ... --out ...``.
"""

from __future__ import annotations

import argparse
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

from benchmarks._timing import figure

__all__ = ["run", "METHODS"]

_REPO = Path(__file__).resolve().parents[1]
_CONF = _REPO / "conf"
# the tiny configs of the three methods the issue names, with the overrides that keep each run to seconds
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    # 60 images: batches of 8 (8 of them) so that generation has batches to deal, as a real run's ~19k images do
    "fedisyn": ("fedisyn_tiny.yaml", ("--fedisyn.generation_batch_size", "8")),
    "dense": ("dense_digits_tiny.yaml", ("--dense.epochs", "5")),  # the server's distillation: 5 of its 30 epochs
    "fedavg": ("fedavg_digits_tiny.yaml", ("--federation.rounds", "3", "--partition.num_clients", "8")),
}


class _RankReport:
    """A callback writing this rank's wall time, waits (from the installed :class:`WaitLog`) and phase times (from
    the installed :class:`PhaseLog`, with each client's seconds of every round) at the run's end."""

    def __init__(self, out: Path, log: Any, phases: Any) -> None:
        self.out, self.log, self.phases, self.start, self.before = out, log, phases, 0.0, {}
        self.phases_before: dict[str, float] = {}
        self.clients: list[list[float]] = []

    def on_run_start(self, **_: Any) -> None:
        self.start, self.before = time.monotonic(), dict(self.log.seconds)  # the start-up's waits are not counted
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
    from fl_lightning.federation.collectives import recording_waits
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
        "waits": [{k: round(v, 3) for k, v in sorted(r["waits"].items())} for r in ranks],
    }


def run(
    *,
    quick: bool,
    device: torch.device | None = None,
    processes: Sequence[int] = (1, 2, 4),
    methods: Sequence[str] = tuple(METHODS),
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Every figure of the suite (see the module docstring); CPU processes whatever ``device``.

    Args:
        quick: 1 and 2 processes only.
        device: ignored (gloo CPU processes); accepted for the common runner signature.
        processes: the process counts.
        methods: a subset of :data:`METHODS`.
        work_dir: where the runs go (default: a temporary folder, removed afterwards).
    """
    counts = [p for p in processes if not quick or p <= 2]
    work = Path(tempfile.mkdtemp(prefix="fl_bench_ranks_", dir=work_dir))
    results: dict[str, Any] = {}
    points: dict[str, Any] = {}
    try:
        for method in methods:
            for p in counts:
                points[f"{method}_p{p}"] = point = _point(work, method, p)
                print(f"ranks {method} processes={p}: {json.dumps(point)}", file=sys.stderr, flush=True)
                results[f"{method}_p{p}_wall_s"] = figure(point["wall_s"], "s", note="rank 0, the rounds")
                if p > 1:
                    results[f"{method}_p{p}_wait_share_max"] = figure(
                        100.0 * point["wait_share_max"],
                        "%",
                        op="<=",
                        bound=20.0,
                        note="the most any rank waited in collectives",
                        details=point,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["sizes"] = {"methods": list(methods), "processes": counts, "points": points}
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
