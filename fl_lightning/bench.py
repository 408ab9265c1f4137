"""The former benchmark command. The benchmarks are scripts, not part of the library: they live in the top-level
``benchmarks/`` folder of a checkout, run as ``python -m benchmarks …`` from the repository root
(docs/benchmarks.md). ``python -m fl_lightning.bench …`` prints that command and exits with status 2."""

import shlex
import sys

__all__ = ["new_command"]


def new_command(argv: list[str]) -> str:
    """The command that replaces ``python -m fl_lightning.bench ARGV``."""
    return " ".join(["python -m benchmarks", *map(shlex.quote, argv)]).strip()


if __name__ == "__main__":
    print(
        f"fl_lightning: the benchmarks moved out of the package: run `{new_command(sys.argv[1:])}` from the "
        f"repository root (see docs/benchmarks.md)",
        file=sys.stderr,
    )
    sys.exit(2)
