"""The paper pages' result tables, rendered from the one registry of numbers, ``docs/results.yaml``.

Each table in ``docs/fedopal.md`` and ``docs/fedisyn.md`` that states results sits between two markers,
``<!-- results: ID -->`` and ``<!-- /results -->``; its text is :func:`render_block` of the registry entry ``ID``:

* ``fedopal.paper_scale`` / ``fedisyn.paper_scale``: per paper-scale config, the runs it plans (``--list-runs``),
  the paper's numbers (or why they are not here), ours, the GPU-hours estimate and the sizes on disk;
* an entry of ``fedopal.measured``: a table a command of this repository printed;
* ``fedisyn.paper_food101``: the paper's own Food-101 times and traffic (the system model's calibration target).

Example (``tests/test_results_registry.py`` checks that the committed pages are this output)::

    python scripts/results_registry.py --write   # after editing docs/results.yaml
    python scripts/results_registry.py --check   # exit 1 naming the stale tables
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["REGISTRY", "PAGES", "load_registry", "render_block", "rendered_page", "stale_blocks"]

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / "docs" / "results.yaml"
PAGES = {"fedopal": REPO / "docs" / "fedopal.md", "fedisyn": REPO / "docs" / "fedisyn.md"}
BLOCK = re.compile(r"(<!-- results: ([\w.]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def load_registry(path: Path = REGISTRY) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    width = len(columns)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row of {len(row)} cells under {width} columns: {row}")
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * width]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _planned_runs(config: str) -> int:
    from fl_lightning.config.loading import load_config
    from fl_lightning.experiments.plan import plan_runs

    return len(plan_runs(load_config(REPO / config, [])))


def _paper_scale(section: dict[str, Any]) -> list[str]:
    columns = ["config", "data", "runs", "the paper's numbers", "measured here", "GPU-hours (estimate)", "data on disk"]
    rows = [
        [
            f"`{r['config']}`",
            r["data"],
            _planned_runs(r["config"]),
            "not transcribed" if r["paper"] is None else r["paper"],
            "not run" if r["measured"] is None else r["measured"],
            "no estimate" if r["gpu_hours"] is None else r["gpu_hours"],
            r["data_size"],
        ]
        for r in section["rows"]
    ]
    return [
        " ".join(section["note"].split()),
        "",
        *_table(columns, rows),
        "",
        f"Weights on disk: {' '.join(section['weights'].split())}. "
        f"The paper's numbers: {' '.join(section['paper_note'].split())}",
    ]


def _measured(entry: dict[str, Any]) -> list[str]:
    return _table(entry["columns"], entry["rows"])


def _entry(registry: dict[str, Any], block_id: str) -> tuple[str, dict[str, Any]]:
    paper, _, name = block_id.partition(".")
    section = registry.get(paper, {})
    if name in ("paper_scale", "paper_food101") and name in section:
        return name, section[name]
    for entry in section.get("measured", []):
        if entry["id"] == name:
            return "measured", entry
    raise KeyError(f"docs/results.yaml has no entry {block_id!r}")


def render_block(registry: dict[str, Any], block_id: str) -> str:
    """The text between the markers of block ``block_id`` (``paper.entry``): a markdown table and its notes."""
    kind, entry = _entry(registry, block_id)
    if kind == "paper_scale":
        lines = _paper_scale(entry)
    elif kind == "paper_food101":
        lines = [*_table(entry["columns"], entry["rows"]), "", f"Source: {entry['source']}."]
    else:
        lines = _measured(entry)
    return "\n".join(lines) + "\n"


def rendered_page(text: str, registry: dict[str, Any]) -> str:
    """``text`` with every results block re-rendered from ``registry``."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(registry, m.group(2)) + m.group(4), text)


def stale_blocks(registry: dict[str, Any] | None = None) -> list[str]:
    """``page: block`` for every block whose committed text is not the registry's rendering."""
    registry = load_registry() if registry is None else registry
    stale = []
    for page in PAGES.values():
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if m.group(3) != render_block(registry, m.group(2)):
                stale.append(f"{page.relative_to(REPO)}: {m.group(2)}")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="re-render every results block of the paper pages")
    mode.add_argument("--check", action="store_true", help="exit 1 naming the blocks that differ from the registry")
    args = parser.parse_args(argv)
    registry = load_registry()
    if args.write:
        for page in PAGES.values():
            page.write_text(rendered_page(page.read_text(), registry))
        return 0
    stale = stale_blocks(registry)
    for line in stale:
        print(f"stale: {line} (python scripts/results_registry.py --write)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
