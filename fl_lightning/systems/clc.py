"""LoRA depth policies: contribution-aware layer configuration (CLC, FeDiSyn Alg. 1) and baselines.

Device i fine-tunes LoRA in its last x_i of the L transformer blocks. Deeper means more
contribution to the global model but a longer round (more backward compute, D_i·x_i·h_i, and a
larger upload, τ·x_i bits) and more memory (m̄_i + x_i m_i ≤ M_i). CLC (Alg. 1) trades them off
greedily on the utility

    U(x) = Σ_i c_i(x_i) / T(x),   c_i(x) = Σ_{l = L−x}^{L−1} C[i, l]

where C[i, l] is device i's estimated contribution of block l (column L−1 is the last block) and
T(x) the round time given by water-filling (``wfba.py``) with compute D_i(h̄_i + x_i h_i) and
payload τ·x_i. All depths start at 1; each step tries one more block on every device whose memory
allows it and keeps the single increment with the largest utility, as long as it beats the
current utility strictly.

Baselines: ``capacity_depths`` (CAFF: depth ∝ compute capability), ``full_depths`` (all blocks),
``fixed_depths`` (one depth for all). ``policy_depths`` applies any of them by name and reports,
next to the depths, what the policy asked for and each device's memory limit, so a caller can say
which devices memory held back instead of capping silently.

``allocation="equal"`` (everywhere a round time is computed) replaces water-filling by the equal
split B/N, the paper's "w/o WFBA" ablation; CLC then optimises U against that round time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fl_lightning.systems.wfba import ALLOCATIONS, allocate_bandwidth, equal_bandwidth

__all__ = [
    "contribution_aware_depths",
    "capacity_depths",
    "full_depths",
    "fixed_depths",
    "memory_depth_limits",
    "depth_contribution",
    "depth_round_time",
    "policy_depths",
    "DepthDecision",
    "DEPTH_POLICIES",
]

DEPTH_POLICIES: tuple[str, ...] = ("clc", "capacity", "full", "fixed")
"""clc = FeDiSyn (Alg. 1); capacity = CAFF; full = SFLF (all blocks); fixed = one depth for all."""


def memory_depth_limits(
    *,
    fixed_memory_gb: np.ndarray,
    memory_per_layer_gb: np.ndarray,
    memory_budget_gb: np.ndarray,
    num_layers: int,
) -> np.ndarray:
    """Per-device largest depth with m̄_i + x m_i ≤ M_i, capped at L (vectorised ``max_depth``).

    Raises:
        ValueError: if some device cannot hold even one trainable block.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
    m_bar = np.asarray(fixed_memory_gb, dtype=np.float64)
    m = np.asarray(memory_per_layer_gb, dtype=np.float64)
    M = np.asarray(memory_budget_gb, dtype=np.float64)
    # Slack so an exact fit (9.0 / 1.5 = 6) is not floored to 5 by rounding.
    limits = np.minimum(np.floor((M - m_bar) / m + 1e-9), num_layers).astype(np.int64)
    if np.any(limits < 1):
        bad = np.flatnonzero(limits < 1).tolist()
        raise ValueError(
            f"devices {bad} cannot hold one LoRA block: memory_budget_gb {M[bad].tolist()} is "
            "below fixed_memory_gb + memory_per_layer_gb"
        )
    return limits


def depth_contribution(contributions: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """c_i(x_i): the sum of device i's contributions over its last x_i blocks, shape (N,)."""
    C = np.asarray(contributions, dtype=np.float64)  # (N, L)
    x = np.asarray(depths, dtype=np.int64)  # (N,)
    L = C.shape[1]
    # Suffix sums: tail[i, k] = Σ of the last k columns of row i (tail[:, 0] = 0).
    tail = np.concatenate([np.zeros((C.shape[0], 1)), np.cumsum(C[:, ::-1], axis=1)], axis=1)
    return tail[np.arange(C.shape[0]), np.clip(x, 0, L)]


def depth_round_time(
    depths: np.ndarray,
    *,
    num_samples: np.ndarray,
    forward_time_s: np.ndarray,
    backward_time_per_layer_s: np.ndarray,
    layer_bits: float,
    spectral_efficiency: np.ndarray,
    total_bandwidth_hz: float,
    allocation: str = "wfba",
) -> tuple[np.ndarray, float]:
    """Bandwidths and round time T(x) of depths x, by water-filling (default) or the equal split.

    Device i computes D_i (h̄_i + x_i h_i) seconds and uploads τ x_i bits.

    Args:
        allocation: ``"wfba"`` (Alg. 2, :func:`~fl_lightning.systems.wfba.allocate_bandwidth`) or
            ``"equal"`` (B/N, :func:`~fl_lightning.systems.wfba.equal_bandwidth`).
    """
    allocate = _allocator(allocation)
    x = np.asarray(depths, dtype=np.float64)
    H = np.asarray(num_samples, dtype=np.float64) * (
        np.asarray(forward_time_s, dtype=np.float64) + x * np.asarray(backward_time_per_layer_s, dtype=np.float64)
    )
    return allocate(H, layer_bits * x, spectral_efficiency, total_bandwidth_hz)


def _allocator(allocation: str):
    if allocation == "wfba":
        return allocate_bandwidth
    if allocation == "equal":
        return equal_bandwidth
    raise ValueError(f"unknown bandwidth allocation {allocation!r}; expected one of {list(ALLOCATIONS)}")


def contribution_aware_depths(
    *,
    contributions: np.ndarray,
    num_samples: np.ndarray,
    forward_time_s: np.ndarray,
    backward_time_per_layer_s: np.ndarray,
    fixed_memory_gb: np.ndarray,
    memory_per_layer_gb: np.ndarray,
    memory_budget_gb: np.ndarray,
    layer_bits: float,
    spectral_efficiency: np.ndarray,
    total_bandwidth_hz: float,
    allocation: str = "wfba",
) -> np.ndarray:
    """CLC greedy depths (Alg. 1).

    Args:
        contributions: (N, L) per-device per-block contribution estimates, column L−1 the last
            block.
        num_samples: (N,) samples each device processes per round.
        forward_time_s, backward_time_per_layer_s: (N,) h̄_i and h_i.
        fixed_memory_gb, memory_per_layer_gb, memory_budget_gb: (N,) m̄_i, m_i, M_i.
        layer_bits: τ, bits uploaded per trainable block.
        spectral_efficiency: (N,) e_i in bit/s/Hz.
        total_bandwidth_hz: B.
        allocation: how T(x) shares B: ``"wfba"`` (FeDiSyn) or ``"equal"`` (w/o WFBA).

    Returns:
        (N,) int64 depths in [1, memory limit].
    """
    C = np.asarray(contributions, dtype=np.float64)
    if C.ndim != 2 or C.shape[1] < 1:
        raise ValueError(f"contributions must be an (N, L) array with L >= 1, got shape {C.shape}")
    N, L = C.shape
    if not np.all(np.isfinite(C)):
        raise ValueError("contributions must be finite")
    _allocator(allocation)  # fail on a bad name before the greedy starts
    limits = memory_depth_limits(
        fixed_memory_gb=fixed_memory_gb, memory_per_layer_gb=memory_per_layer_gb, memory_budget_gb=memory_budget_gb, num_layers=L
    )
    if limits.shape != (N,):
        raise ValueError(f"memory arrays must hold one value per device ({N}), got shape {limits.shape}")
    if not layer_bits > 0:
        raise ValueError(f"layer_bits (bits per LoRA block) must be > 0, got {layer_bits!r}")

    def utility(x: np.ndarray) -> float:
        _, T = depth_round_time(
            x,
            num_samples=num_samples,
            forward_time_s=forward_time_s,
            backward_time_per_layer_s=backward_time_per_layer_s,
            layer_bits=layer_bits,
            spectral_efficiency=spectral_efficiency,
            total_bandwidth_hz=total_bandwidth_hz,
            allocation=allocation,
        )
        return float(depth_contribution(C, x).sum()) / T  # U(x) = Σ c_i(x_i) / T(x)

    x = np.ones(N, dtype=np.int64)
    current = utility(x)
    while True:
        best_gain, best_i = -np.inf, -1
        for i in np.flatnonzero(x < limits):  # devices whose memory allows one more block
            x[i] += 1
            gain = utility(x)
            x[i] -= 1
            if gain > best_gain:  # strict: ties go to the lowest device index
                best_gain, best_i = gain, int(i)
        if best_i < 0 or not best_gain > current:
            return x
        x[best_i] += 1
        current = best_gain


def capacity_depths(
    *,
    forward_time_s: np.ndarray,
    backward_time_per_layer_s: np.ndarray,
    fixed_memory_gb: np.ndarray,
    memory_per_layer_gb: np.ndarray,
    memory_budget_gb: np.ndarray,
    num_layers: int,
) -> np.ndarray:
    """CAFF baseline: depth proportional to compute capability, capped by memory, at least 1.

    Capability is the inverse of a sample's full-depth compute time, 1 / (h̄_i + L h_i); the most
    capable device gets all L blocks and device i gets round(L · cap_i / max cap).
    """
    limits = memory_depth_limits(
        fixed_memory_gb=fixed_memory_gb,
        memory_per_layer_gb=memory_per_layer_gb,
        memory_budget_gb=memory_budget_gb,
        num_layers=num_layers,
    )
    return np.minimum(_capacity_request(forward_time_s, backward_time_per_layer_s, num_layers), limits)


def _capacity_request(forward_time_s: np.ndarray, backward_time_per_layer_s: np.ndarray, num_layers: int) -> np.ndarray:
    """CAFF's depths before memory: round(L · cap_i / max cap), at least 1."""
    h_bar = np.asarray(forward_time_s, dtype=np.float64)
    h = np.asarray(backward_time_per_layer_s, dtype=np.float64)
    if np.any(h_bar <= 0) or np.any(h <= 0):
        raise ValueError(f"forward_time_s and backward_time_per_layer_s must be > 0 s, got {h_bar.tolist()} and {h.tolist()}")
    capability = 1.0 / (h_bar + num_layers * h)
    # Round half up, with slack so 4.5 computed as 4.4999999 still rounds to 5.
    depths = np.floor(num_layers * capability / capability.max() + 0.5 + 1e-9).astype(np.int64)
    return np.maximum(depths, 1)


def full_depths(num_devices: int, num_layers: int) -> np.ndarray:
    """Every device trains all L blocks (memory permitting is the caller's concern)."""
    if num_devices < 0 or num_layers < 1:
        raise ValueError(f"full_depths needs num_devices >= 0 and num_layers >= 1, got {num_devices!r} and {num_layers!r}")
    return np.full(num_devices, num_layers, dtype=np.int64)


def fixed_depths(num_devices: int, depth: int) -> np.ndarray:
    """Every device trains the same number of last blocks."""
    if num_devices < 0 or depth < 1:
        raise ValueError(f"fixed_depths needs num_devices >= 0 and depth >= 1, got {num_devices!r} and {depth!r}")
    return np.full(num_devices, depth, dtype=np.int64)


class DepthDecision(NamedTuple):
    """What a depth policy decided for one round (arrays over the devices, in order).

    Attributes:
        requested: the depths the policy asks for, before memory.
        limits: each device's memory limit (largest x with m̄_i + x m_i ≤ M_i, at most L).
        depths: what the devices can train, min(requested, limits).
        over_memory: devices whose memory holds fewer blocks than the policy asked for.
    """

    requested: np.ndarray
    limits: np.ndarray
    depths: np.ndarray
    over_memory: np.ndarray


def policy_depths(
    policy: str,
    *,
    num_layers: int,
    forward_time_s: np.ndarray,
    backward_time_per_layer_s: np.ndarray,
    fixed_memory_gb: np.ndarray,
    memory_per_layer_gb: np.ndarray,
    memory_budget_gb: np.ndarray,
    contributions: np.ndarray | None = None,
    num_samples: np.ndarray | None = None,
    layer_bits: float | None = None,
    spectral_efficiency: np.ndarray | None = None,
    total_bandwidth_hz: float | None = None,
    fixed_depth: int = 1,
    allocation: str = "wfba",
) -> DepthDecision:
    """Depths of one round under a named policy, with what memory held back.

    Args:
        policy: one of :data:`DEPTH_POLICIES`: ``"clc"`` (FeDiSyn, Alg. 1; needs ``contributions``,
            ``num_samples``, ``layer_bits``, ``spectral_efficiency``, ``total_bandwidth_hz``),
            ``"capacity"`` (CAFF), ``"full"`` (SFLF: all L blocks), ``"fixed"`` (``fixed_depth``).
        num_layers: L, blocks of the model.
        forward_time_s, backward_time_per_layer_s: (N,) h̄_i and h_i.
        fixed_memory_gb, memory_per_layer_gb, memory_budget_gb: (N,) m̄_i, m_i, M_i.
        contributions, num_samples, layer_bits, spectral_efficiency, total_bandwidth_hz: as in
            :func:`contribution_aware_depths` (CLC only).
        fixed_depth: x of the ``"fixed"`` policy, in [1, L].
        allocation: the bandwidth allocation CLC optimises against (``"wfba"`` or ``"equal"``).

    Returns:
        A :class:`DepthDecision`. CLC searches within memory, so it never asks for more; ``full`` and
        ``fixed`` (and ``capacity``) may, and ``over_memory`` says where.
    """
    limits = memory_depth_limits(
        fixed_memory_gb=fixed_memory_gb,
        memory_per_layer_gb=memory_per_layer_gb,
        memory_budget_gb=memory_budget_gb,
        num_layers=num_layers,
    )
    n = limits.shape[0]
    if policy == "clc":
        missing = [
            k
            for k, v in dict(
                contributions=contributions,
                num_samples=num_samples,
                layer_bits=layer_bits,
                spectral_efficiency=spectral_efficiency,
                total_bandwidth_hz=total_bandwidth_hz,
            ).items()
            if v is None
        ]
        if missing:
            raise TypeError(f"policy_depths('clc') needs {missing}")
        C = np.asarray(contributions, dtype=np.float64)
        if C.ndim != 2 or C.shape != (n, num_layers):
            raise ValueError(f"contributions must have shape (N, L) = ({n}, {num_layers}), got {C.shape}")
        requested = contribution_aware_depths(
            contributions=C,
            num_samples=num_samples,
            forward_time_s=forward_time_s,
            backward_time_per_layer_s=backward_time_per_layer_s,
            fixed_memory_gb=fixed_memory_gb,
            memory_per_layer_gb=memory_per_layer_gb,
            memory_budget_gb=memory_budget_gb,
            layer_bits=layer_bits,
            spectral_efficiency=spectral_efficiency,
            total_bandwidth_hz=total_bandwidth_hz,
            allocation=allocation,
        )
    elif policy == "capacity":
        requested = _capacity_request(forward_time_s, backward_time_per_layer_s, num_layers)
    elif policy == "full":
        requested = full_depths(n, num_layers)
    elif policy == "fixed":
        if not 1 <= fixed_depth <= num_layers:
            raise ValueError(f"fixed_depth must be an int in [1, {num_layers}] (the model's blocks), got {fixed_depth!r}")
        requested = fixed_depths(n, fixed_depth)
    else:
        raise ValueError(f"unknown depth policy {policy!r}; expected one of {list(DEPTH_POLICIES)}")
    requested = np.asarray(requested, dtype=np.int64)
    return DepthDecision(requested=requested, limits=limits, depths=np.minimum(requested, limits), over_memory=requested > limits)
