"""Every test file alone, each in a fresh ``python -m pytest FILE`` process, in a shuffled order.

A test that passes only after another test has run in the same process (it imported a module, set a global,
warmed a cache) is not a test of what a user's fresh process does: inside one whole-suite run nobody sees it.
This runs each file by itself — slow tests included (``-m "slow or not slow"``), its tests shuffled by
pytest-randomly with a seed drawn here and printed — and reports every file that fails, with the command that
reproduces it. Two files run at once with ``--jobs 2`` (the test processes use one intra-op thread each:
``tests/conftest.py``).

Example (what ``.ci/run`` does, on AVX2 kernels)::

    ATEN_CPU_CAPABILITY=avx2 python scripts/test_files_alone.py --jobs 2

Exit status: 0 when every file passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_files(root: Path) -> list[Path]:
    """The ``test_*.py`` files under ``root``, relative to the repository, sorted."""
    return sorted(p.relative_to(REPO) for p in root.rglob("test_*.py"))


def command(path: Path, seed: int) -> list[str]:
    """The pytest command line that runs ``path`` alone (slow tests included, shuffled with ``seed``)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        str(path),
        "-m",
        "slow or not slow",
        "-p",
        "randomly",
        "-p",
        "no:cacheprovider",
        f"--randomly-seed={seed}",
        "-q",
        "--no-header",
        "-rfE",
    ]


def run_file(path: Path, seed: int, timeout_s: float) -> tuple[Path, int, float, str]:
    """Run one file; returns (file, exit status, seconds, the tail of its output)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(command(path, seed), cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code, out = -1, f"timed out after {timeout_s:.0f} s\n{err.stdout or ''}"
    return path, code, time.monotonic() - start, out[-4000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="files run at once (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="order and per-file seeds (default: drawn)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per file (default 1800)")
    parser.add_argument("paths", nargs="*", type=Path, help="test files (default: every file under tests/)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    files = [Path(p) for p in args.paths] or test_files(REPO / "tests")
    rng = random.Random(seed)
    rng.shuffle(files)
    seeds = {f: rng.randrange(2**31) for f in files}
    print(
        f"{len(files)} test files, each alone; seed {seed} "
        f"(rerun this order: python {Path(__file__).relative_to(REPO)} --seed {seed})",
        flush=True,
    )
    start, failed = time.monotonic(), []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for path, code, seconds, out in pool.map(lambda f: run_file(f, seeds[f], args.timeout), files):
            # pytest's 5: no test selected in this file (e.g. a helper-only module) is no failure
            ok = code in (0, 5)
            print(f"{'ok  ' if ok else 'FAIL'} {seconds:6.1f} s  {path}", flush=True)
            if not ok:
                failed.append(path)
                print(f"  reproduce: {' '.join(command(path, seeds[path])[1:])}\n{out}", flush=True)
    total = time.monotonic() - start
    verdict = f"{len(failed)} of {len(files)} test files failed" if failed else f"all {len(files)} test files passed"
    print(f"{verdict} alone, each in a fresh process, in {total / 60:.1f} min (seed {seed})")
    for path in failed:
        print(f"failed alone: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
