"""Server-side averaging of client states: one streamed fold, pure functions on tensors.

* :class:`WeightedMean` — THE weighted-mean fold every averaging method uses (FedAvg, McMahan et al.
  2017, of heads, prompts, whole models, LoRA blocks):

      w[key] = Σ_k n_k w_k[key]  /  Σ_k n_k   over the uploads k that hold ``key``,

  folded one upload at a time in client order (server memory: one running sum per key, flat in K).
  Sums run in float64 so that many small weights do not lose precision; the mean comes back in the
  dtype the key arrived in, and an integer (or bool) buffer — e.g. BatchNorm's ``num_batches_tracked``
  — is rounded to the nearest integer first rather than truncated. That rule lives here only.
* :func:`weighted_average` — the fold over one list of tensors.
* :func:`layerwise_average` — FeDiSyn's depth-aware LoRA aggregation: device i trains LoRA only in
  its last x_i blocks, so block l is averaged over the devices that trained it,

      W_l = Σ_i 1[l > L − x_i] · n_i · W_{i,l}  /  Σ_i 1[l > L − x_i] · n_i,

  with blocks numbered 1..L and the Iverson indicator 1[·] read off which blocks a client uploaded
  (the fold's per-key weight does exactly that); a block that no device trained keeps its global value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fl_lightning.federation.transport import Upload

__all__ = ["WeightedMean", "mean_of_uploads", "weighted_average", "layerwise_average", "check_whole_layers"]


_SCRATCH_MIN_NUMEL = 1 << 14  # from this size a key folds through the reused scratch buffer (WeightedMean._term)


class WeightedMean:
    """Streamed weighted mean per key, in float64 (see the module docstring).

    Example:
        >>> fold = WeightedMean()
        >>> fold.add({"w": torch.tensor([1.0])}, 1.0)
        >>> fold.add({"w": torch.tensor([4.0])}, 3.0)
        >>> fold.result()["w"]
        tensor([3.2500])
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}  # Σ n_k w_k[key], float64
        self._weights: dict[str, float] = {}  # Σ n_k over the uploads that held the key
        self._dtypes: dict[str, torch.dtype] = {}
        self.total_weight = 0.0  # Σ n_k over every add
        self._scratch: dict[torch.device, torch.Tensor] = {}  # see _term

    def add(self, tensors: Mapping[str, torch.Tensor], weight: float) -> None:
        """Fold one client's tensors in with weight ``weight`` (>= 0, e.g. its sample count n_k)."""
        w = float(weight)
        if not (w >= 0.0 and math.isfinite(w)):  # also rejects NaN
            raise ValueError(f"weights must be >= 0 and finite, got {weight!r}")
        for key, tensor in tensors.items():
            if key not in self._sums:
                self._sums[key] = tensor.detach().to(torch.float64) * w
                self._weights[key], self._dtypes[key] = w, tensor.dtype
                continue
            acc = self._sums[key]
            if tensor.shape != acc.shape:
                raise ValueError(f"cannot average tensors of shapes {tuple(acc.shape)} and {tuple(tensor.shape)} (key {key!r})")
            if tensor.numel() < _SCRATCH_MIN_NUMEL:  # small: the temporaries are cheap, the extra calls are not
                acc += tensor.detach().to(torch.float64) * w
            else:  # the same float64 product and sum, bit for bit, through one reused buffer: a fresh
                # float64 temporary per large key and client is mostly page faults (~2x the fold)
                term = self._term(acc)
                term.copy_(tensor.detach())
                term.mul_(w)
                acc.add_(term)
            self._weights[key] += w
        self.total_weight += w

    def _term(self, like: torch.Tensor) -> torch.Tensor:
        """A float64 scratch tensor shaped like ``like``, on its device: a view of one buffer per device,
        grown to the largest key (so the fold's extra memory is one key's, not one model's)."""
        buffer = self._scratch.get(like.device)
        if buffer is None or buffer.numel() < like.numel():
            buffer = self._scratch[like.device] = torch.empty(like.numel(), dtype=torch.float64, device=like.device)
        return buffer[: like.numel()].view(like.shape)

    def __len__(self) -> int:
        return len(self._sums)

    def parts(self) -> tuple[dict[str, tuple[tuple[int, ...], float, torch.dtype]], dict[str, torch.Tensor], float]:
        """The fold so far, to be carried on elsewhere (:meth:`carried`): ``({key: (shape, Σ n_k, incoming dtype)},
        {key: the float64 sum Σ n_k w_k}, Σ n_k over every add)``."""
        header = {key: (tuple(acc.shape), self._weights[key], self._dtypes[key]) for key, acc in self._sums.items()}
        return header, dict(self._sums), self.total_weight

    @classmethod
    def carried(
        cls,
        header: Mapping[str, tuple[tuple[int, ...], float, torch.dtype]],
        sums: Mapping[str, torch.Tensor],
        total_weight: float,
    ) -> WeightedMean:
        """The fold :meth:`parts` described, ready for the next :meth:`add`: adding on from it gives the floats of
        one fold that never stopped (the float64 sums travel exactly)."""
        fold = cls()
        for key, (_, weight, dtype) in header.items():
            fold._sums[key], fold._weights[key], fold._dtypes[key] = sums[key], float(weight), dtype
        fold.total_weight = float(total_weight)
        return fold

    def result(self) -> dict[str, torch.Tensor]:
        """``{key: Σ n_k w_k / Σ n_k}`` in each key's incoming dtype (integers rounded to nearest)."""
        out = {}
        for key, acc in self._sums.items():
            if self._weights[key] <= 0.0:
                raise ValueError(f"{key!r}: every upload that holds it has weight 0 (weights need a positive sum)")
            mean = acc / self._weights[key]
            dtype = self._dtypes[key]
            out[key] = (mean if dtype.is_floating_point or dtype.is_complex else mean.round()).to(dtype)
        return out


def mean_of_uploads(
    state: dict[str, torch.Tensor],
    uploads: Mapping[int, Upload],
    *,
    weighted: bool = True,
    keys: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """FedAvg's server step (McMahan et al. 2017, Alg. 1, w_{t+1} = Σ_k (n_k / n) w_k): each key of ``state`` as the
    uploads' mean, weighted by their ``meta["num_samples"]`` (equally with ``weighted`` false), folded one upload at a
    time in client order; ``state`` itself when no upload arrived. ``keys``: those averaged (default: the state's)."""
    fold, keys = WeightedMean(), list(state) if keys is None else keys
    for upload in uploads.values():
        fold.add({k: upload.tensors[k] for k in keys}, float(upload.meta["num_samples"]) if weighted else 1.0)
    return fold.result() if fold.total_weight > 0 else state


def weighted_average(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """``Σ_k w_k T_k / Σ_k w_k`` through :class:`WeightedMean`, returned in ``tensors[0]``'s dtype.

    Args:
        tensors: same-shape tensors (one per client).
        weights: non-negative weights (e.g. client data sizes n_k) with a positive sum.
    """
    if not tensors:
        raise ValueError("nothing to average: no tensors")
    if len(weights) != len(tensors):
        raise ValueError(f"got {len(tensors)} item(s) but {len(weights)} weight(s)")
    fold = WeightedMean()
    for tensor, weight in zip(tensors, weights):
        fold.add({"t": tensor}, weight)
    if fold.total_weight <= 0.0:
        raise ValueError(f"weights must have a positive sum, got {list(weights)}")
    return fold.result()["t"]


def check_whole_layers(
    global_state: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    *,
    layer_of: Callable[[str], int],
    name: str = "client state",
) -> None:
    """A partial state must hold only keys of ``global_state`` and, of each layer it touches, ALL its keys
    (a half-uploaded layer is a bug upstream)."""
    unknown = [k for k in state if k not in global_state]
    if unknown:
        raise ValueError(f"{name} has key {unknown[0]!r} that the global state lacks")
    touched = {layer_of(k) for k in state}
    missing = sorted(k for k in global_state if layer_of(k) in touched and k not in state)
    if missing:
        raise ValueError(f"{name} sent layer {layer_of(missing[0])} only in part: missing {missing[0]!r}")


def layerwise_average(
    global_state: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    *,
    layer_of: Callable[[str], int],
) -> dict[str, torch.Tensor]:
    """Depth-aware aggregation: each layer averaged over the clients that trained it.

    A client takes part in layer l (the Iverson indicator) when its state holds any key of that
    layer; it must then hold ALL of the layer's keys (:func:`check_whole_layers`). The weights are
    renormalised over a layer's participants (the fold's per-key weight). Layers no client sent keep
    the global value.

    Args:
        global_state: the server's current state (all layers); defines the keys of the result.
        client_states: partial states, each a sub-dict of ``global_state``'s keys.
        weights: one non-negative weight per client (data size n_i).
        layer_of: maps a key to its layer index (e.g. ``fl_lightning.models.lora.lora_layer_index``).

    Returns:
        a new state with the keys of ``global_state``.
    """
    if len(weights) != len(client_states):
        raise ValueError(f"got {len(client_states)} client state(s) but {len(weights)} weight(s)")
    fold = WeightedMean()
    for i, (state, weight) in enumerate(zip(client_states, weights)):
        check_whole_layers(global_state, state, layer_of=layer_of, name=f"client state {i}")
        fold.add(state, weight)
    result = {key: value.detach().clone() for key, value in global_state.items()}
    try:
        result.update(fold.result())
    except ValueError as err:
        raise ValueError(f"layer of {err}") from None
    return result
