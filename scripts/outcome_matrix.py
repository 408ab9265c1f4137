"""The spread of every learning-outcome check over seeds, CPU kernels and thread counts.

Runs ``pytest -m outcome`` once per combination of ``FL_TEST_SEED`` (see ``tests/outcomes.py``),
``ATEN_CPU_CAPABILITY`` (torch's kernel switch: ``avx512``, ``avx2``, ``default`` = no vector unit;
``native`` leaves it unset) and ``OMP_NUM_THREADS``, each in a fresh process, collects the values the
checks recorded, and prints per check: the bound, the smallest / mean / largest value seen and how many
combinations fell on the wrong side. A threshold is well placed when its worst value clears it with room.

Example (what the outcome tests' thresholds were set from)::

    python scripts/outcome_matrix.py --seeds 0 1 2 --caps native avx2 default --threads 1 2 --jobs 2

``--jobs 2`` runs two combinations at once; use it only with ``--threads 1`` on a 2-core machine.
``-k EXPR`` narrows the tests as pytest's own ``-k``.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def run_combination(seed: int, cap: str, threads: int, select: str | None, log: Path) -> tuple[int, float]:
    """One ``pytest -m outcome`` in a fresh process; returns its exit status and wall time."""
    env = {**os.environ, "FL_TEST_SEED": str(seed), "OMP_NUM_THREADS": str(threads), "FL_OUTCOME_LOG": str(log)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if cap != "native":
        env["ATEN_CPU_CAPABILITY"] = cap
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "outcome",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(log.with_suffix(".tmp")),
        *(["-k", select] if select else []),
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
    return done.returncode, time.monotonic() - start


def summarize(records: list[dict]) -> list[str]:
    """One line per check: bound, min/mean/max over the combinations, failures."""
    by_check: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        by_check[(r["test"], r["check"])].append(r)
    lines = []
    for (test, check), rows in sorted(by_check.items()):
        values = [r["value"] for r in rows]
        op, bound = rows[0]["op"], rows[0]["bound"]
        worst = min(values) if op in (">", ">=") else max(values)
        failed = sum(not _OPS[op](v, bound) for v in values)
        lines.append(
            f"{test} | {check} {op} {bound:.4g} | worst {worst:.4f} min {min(values):.4f} "
            f"mean {sum(values) / len(values):.4f} max {max(values):.4f} | n={len(values)} failed={failed}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--caps", nargs="+", default=["native", "avx2", "default"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("-k", dest="select", default=None)
    parser.add_argument("--out", type=Path, default=None, help="also write every record here (JSON lines)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        combos = list(product(args.seeds, args.caps, args.threads))
        logs = [Path(tmp) / f"s{s}_{c}_t{t}.jsonl" for s, c, t in combos]
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda i: run_combination(*combos[i], args.select, logs[i]), range(len(combos))))
        records = [json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines()]
    for (s, c, t), (rc, wall) in zip(combos, results):
        print(f"seed {s} {c} {t} thread(s): exit {rc}, {wall:.0f} s")
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print("\n".join(summarize(records)))
    return max(rc for rc, _ in results)


if __name__ == "__main__":
    sys.exit(main())
