"""The CPU cores this process may use, and how the ranks and ``--jobs`` processes of a machine share them.

Read by the loaders' ``data.num_workers: auto`` (``federation/algorithm.py``), the preflight's device check and the
runner's ``--jobs`` (each child its own share of the cores). Nothing here changes a process setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["available_cpus", "ranks_sharing_cores", "core_shares"]


def available_cpus() -> int:
    """CPU cores this process may run on (the affinity mask, which containers and SLURM set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def ranks_sharing_cores(ranks_on_node: int, cpus: int, environ: Mapping[str, str] = os.environ) -> int:
    """How many ranks share this process's cores (:func:`available_cpus`): ``ranks_on_node`` when the ranks were
    started by one process (Fabric's launcher, torchrun) and share its affinity mask; 1 when SLURM started one task
    per rank with its own cores (``srun --ntasks-per-node=N --cpus-per-task=C``: this task's mask holds its C cores
    only, and dividing them again would leave the rank's loader 0 or 1 worker)."""
    per_task = environ.get("SLURM_CPUS_PER_TASK", "")
    tasks = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
    try:
        tasks_here = int(tasks.split("(")[0].split(",")[0])
        own_mask = "SLURM_PROCID" in environ and tasks_here == ranks_on_node and int(per_task) == cpus
    except ValueError:
        own_mask = False
    return 1 if own_mask else max(1, ranks_on_node)


def core_shares(cores: Sequence[int], n: int) -> list[list[int]]:
    """``cores`` dealt into ``n`` disjoint, contiguous, near-equal shares (each at least one core: shares wrap
    around when there are fewer cores than shares) — one per ``--jobs`` child."""
    cores = sorted(cores)
    if len(cores) >= n:
        return [list(part) for part in _split(cores, n)]
    return [[cores[i % len(cores)]] for i in range(n)]


def _split(items: list[int], n: int) -> list[list[int]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        stop = start + size + (i < extra)
        out.append(items[start:stop])
        start = stop
    return out
