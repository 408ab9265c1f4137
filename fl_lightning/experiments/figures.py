"""The report figures' frame: a matplotlib figure on the Agg backend (no display), its layout tightened, saved and
closed. The comparison, the curves and the scripts' accuracy plots draw on its axes; matplotlib is imported only
when a figure is made."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["saved_figure", "comparison_dir_argument"]


@contextmanager
def saved_figure(path: str | Path, *, figsize: tuple[float, float], dpi: int = 120, **save: Any) -> Iterator[Any]:
    """The axes of a new ``figsize`` figure for the block to draw on; after the block, the figure is laid out
    (``tight_layout``), saved to ``path`` at ``dpi`` (``save``: more ``savefig`` keywords) and closed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    yield ax
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, **save)
    plt.close(fig)


def comparison_dir_argument(doc: str, argv: list[str] | None = None) -> Path:
    """A curve script's one argument, the comparison's folder (``--help``: the script's ``doc``); a folder that does not
    exist is one line and exit status 2."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("comparison_dir", type=Path, help="the folder a comparison wrote its runs to")
    folder = parser.parse_args(argv).comparison_dir
    if not folder.is_dir():
        parser.error(f"{folder} is not a folder (a comparison's output, e.g. runs/<name>)")
    return folder
