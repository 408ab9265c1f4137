"""Command-line entry: ``python -m fl_lightning.train --config FILE [--section.key VALUE ...]``.

``--help`` lists the flags; docs/usage.md is the guide. The command lives in :mod:`fl_lightning.experiments`
(``cli``: the flags and the error contract; ``plan``, ``runner``, ``compare``: the runs it plans, runs and
reports); this module is the short name that ``python -m`` and Fabric's launcher run.
"""

from __future__ import annotations

import sys

from fl_lightning.experiments.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
