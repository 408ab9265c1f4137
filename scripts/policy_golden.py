"""Final server states of a fixed set of tiny runs covering every update policy and their combinations, saved or
checked bit for bit (``torch.equal``): the guard of a restructuring of the engine (step 32).

    python scripts/policy_golden.py save /tmp/golden.pt     # before the change
    python scripts/policy_golden.py check /tmp/golden.pt    # after: exit 1 naming each run and key that differs

The runs are the tiny FedAvg head of conf/fedavg_digits_tiny.yaml (SCAFFOLD on the same head), 2–3
rounds; the last one runs on 2 processes. Bit-for-bit equality holds on one machine (the same kernels): across
CPUs compare with a tolerance (tests/federation/test_policy_order.py keeps that part).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TINY = ("--partition.num_clients", "7", "--federation.rounds", "3", "--data.num_samples", "400", "--logging.progress", "false")
STALE = (
    "--federation.clients.speed_spread",
    "0.5",
    "--federation.clients.deadline_s",
    "2.5",
    "--federation.clients.late",
    "stale",
)
DP = (
    "--federation.privacy.mechanism",
    "dp_fedavg",
    "--federation.privacy.noise_multiplier",
    "0.5",
    "--federation.privacy.delta",
    "0.01",
    "--federation.privacy.clip_norm",
    "0.5",
    "--federation.privacy.reproducible_noise",
    "true",
)  # the noise seeded: the same on every run
RUNS: dict[str, tuple[str, ...]] = {
    "dp_fedavg+fedadam": ("fedavg_digits_tiny", *DP, "--federation.server_optimizer.name", "fedadam"),
    "krum+sign_flip": (
        "fedavg_digits_tiny",
        "--federation.aggregator.name",
        "krum",
        "--federation.aggregator.num_malicious",
        "2",
        "--federation.attack.kind",
        "sign_flip",
        "--federation.attack.fraction",
        "0.3",
    ),
    "stale+fedyogi": ("fedavg_digits_tiny", *STALE, "--federation.server_optimizer.name", "fedyogi"),
    # dropout (and availability) beside a robust aggregator is refused (its f-of-n bound); stragglers are not
    "stragglers+median": (
        "fedavg_digits_tiny",
        "--federation.clients.stragglers",
        "0.5",
        "--federation.aggregator.name",
        "median",
    ),
    "dropout+fedavgm": (
        "fedavg_digits_tiny",
        "--federation.clients.dropout",
        "0.3",
        "--federation.server_optimizer.name",
        "fedavgm",
        "--federation.server_optimizer.momentum",
        "0.9",
    ),
    "scaffold+availability": (
        "fedavg_digits_tiny",
        "--algorithm",
        "scaffold",
        "--federation.clients.availability",
        "0.6",
        "--train.epochs",
        "1",
    ),
    "trimmed_mean+scale+fedadagrad": (
        "fedavg_digits_tiny",
        "--federation.aggregator.name",
        "trimmed_mean",
        "--federation.attack.kind",
        "scale",
        "--federation.attack.fraction",
        "0.2",
        "--federation.server_optimizer.name",
        "fedadagrad",
    ),
    "multi_krum+gaussian+fedavgm, 2 processes": (
        "fedavg_digits_tiny",
        "--federation.aggregator.name",
        "multi_krum",
        "--federation.aggregator.num_malicious",
        "1",
        "--federation.attack.kind",
        "gaussian",
        "--federation.attack.fraction",
        "0.2",
        "--federation.server_optimizer.name",
        "fedavgm",
        "--federation.server_optimizer.momentum",
        "0.5",
        "--federation.devices",
        "2",
    ),
}


def final_state(name: str, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``server.pt``'s tensors of run ``name`` (a fresh process, as a user runs it)."""
    config, *extra = RUNS[name]
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning.train",
        "--config",
        str(REPO / "conf" / f"{config}.yaml"),
        "--output_dir",
        str(folder),
        "--run_name",
        "run",
        *TINY,
        *extra,
    ]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    saved = torch.load(folder / "run" / "checkpoints" / "server.pt", map_location="cpu", weights_only=False)
    return {
        part: {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}
        for part, value in saved.items()
        if isinstance(value, dict) and part in ("state", "server_optimizer", "policies")
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("mode", choices=("save", "check"), help="save the final states, or check them against PATH")
    parser.add_argument("path", type=Path, help="the golden file (tests/federation/fixtures/policy_golden.pt)")
    parser.add_argument("runs", nargs="*", help=f"only these runs (default: all of {', '.join(RUNS)})")
    args = parser.parse_args(argv[1:])
    if set(args.runs) - set(RUNS) or (args.mode == "check" and not args.path.is_file()):
        parser.error(f"runs are among {', '.join(map(repr, RUNS))}; check reads an existing file")
    mode, path, only = args.mode, args.path, args.runs or list(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        states = {name: final_state(name, Path(tmp) / str(i)) for i, name in enumerate(only)}
    if mode == "save":
        torch.save(states, path)
        print(f"saved {len(states)} runs to {path}")
        return 0
    golden, bad = torch.load(path, weights_only=False), []
    for name, parts in states.items():
        flat_now = {f"{p}/{k}": v for p, d in parts.items() for k, v in d.items()}
        flat_then = {f"{p}/{k}": v for p, d in golden[name].items() for k, v in d.items()}
        norm = lambda k: k.replace("policies/server_optimizer/", "server_optimizer/")  # noqa: E731
        flat_now, flat_then = {norm(k): v for k, v in flat_now.items()}, {norm(k): v for k, v in flat_then.items()}
        if flat_now.keys() != flat_then.keys():
            bad.append(f"{name}: keys differ: {sorted(flat_now.keys() ^ flat_then.keys())}")
        bad += [f"{name}: {k} differs" for k in flat_now.keys() & flat_then.keys() if not torch.equal(flat_now[k], flat_then[k])]
        print(f"{name}: {'equal' if not any(b.startswith(name + ':') for b in bad) else 'DIFFERS'} ({len(flat_now)} tensors)")
    print("\n".join(bad) or f"all {len(states)} runs equal by torch.equal")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
