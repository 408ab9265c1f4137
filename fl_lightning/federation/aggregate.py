"""Server-side averaging of client states (pure functions on tensors).

* :func:`weighted_average` / :func:`average_states` — FedAvg (McMahan et al., 2017):
  ``w = Σ_k n_k w_k / Σ_k n_k``.
* :func:`layerwise_average` — FeDiSyn's depth-aware LoRA aggregation: device i trains LoRA only in
  its last x_i blocks, so block l is averaged over the devices that trained it,

      W_l = Σ_i 1[l > L − x_i] · n_i · W_{i,l}  /  Σ_i 1[l > L − x_i] · n_i,

  with blocks numbered 1..L and the Iverson indicator 1[·] read off which blocks a client uploaded; a block that no device
  trained this round keeps its global value.

Sums run in float64 so that many small weights do not lose precision in half/single precision;
results come back in the inputs' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["weighted_average", "average_states", "layerwise_average"]


def _check_weights(weights: Sequence[float], count: int) -> list[float]:
    values = [float(w) for w in weights]
    if len(values) != count:
        raise ValueError(f"got {count} item(s) but {len(values)} weight(s)")
    if any(not w >= 0.0 for w in values):  # also rejects NaN
        raise ValueError(f"weights must be >= 0, got {values}")
    if sum(values) <= 0.0:
        raise ValueError(f"weights must have a positive sum, got {values}")
    return values


def weighted_average(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """``Σ_k w_k T_k / Σ_k w_k``, accumulated in float64, returned in ``tensors[0]``'s dtype.

    Args:
        tensors: same-shape tensors (one per client).
        weights: non-negative weights (e.g. client data sizes n_k) with a positive sum.
    """
    if not tensors:
        raise ValueError("nothing to average: no tensors")
    w = _check_weights(weights, len(tensors))
    shape, dtype = tensors[0].shape, tensors[0].dtype
    total = sum(w)
    acc = torch.zeros(shape, dtype=torch.float64, device=tensors[0].device)
    for tensor, weight in zip(tensors, w):
        if tensor.shape != shape:
            raise ValueError(f"cannot average tensors of shapes {tuple(shape)} and {tuple(tensor.shape)}")
        acc += tensor.detach().to(torch.float64) * (weight / total)
    return acc.to(dtype)


def average_states(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """FedAvg of whole states: every state must hold the same keys.

    Returns:
        ``{key: weighted_average([s[key] for s in states], weights)}``.
    """
    if not states:
        raise ValueError("nothing to average: no states")
    _check_weights(weights, len(states))
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            diff = sorted(set(state) ^ set(keys))
            raise ValueError(f"state {i} has different keys from state 0, e.g. {diff[0]!r}")
    return {key: weighted_average([s[key] for s in states], weights) for key in keys}


def layerwise_average(
    global_state: Mapping[str, torch.Tensor],
    client_states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    *,
    layer_of: Callable[[str], int],
) -> dict[str, torch.Tensor]:
    """Depth-aware aggregation: each layer averaged over the clients that trained it.

    A client takes part in layer l (the Iverson indicator) when its state holds any key of that
    layer; it must then hold ALL of the layer's keys, since a half-uploaded layer is a bug upstream.
    Weights are renormalised over a layer's participants. Layers no client sent keep the global value.

    Args:
        global_state: the server's current state (all layers); defines the keys of the result.
        client_states: partial states, each a sub-dict of ``global_state``'s keys.
        weights: one non-negative weight per client (data size n_i).
        layer_of: maps a key to its layer index (e.g. ``fl_lightning.models.lora.lora_layer_index``).

    Returns:
        a new state with the keys of ``global_state``.
    """
    w = [float(x) for x in weights]
    if len(w) != len(client_states):
        raise ValueError(f"got {len(client_states)} client state(s) but {len(w)} weight(s)")
    if any(not x >= 0.0 for x in w):
        raise ValueError(f"weights must be >= 0, got {w}")

    keys_of_layer: dict[int, set[str]] = {}
    for key in global_state:
        keys_of_layer.setdefault(layer_of(key), set()).add(key)

    participants: dict[int, list[int]] = {layer: [] for layer in keys_of_layer}
    for i, state in enumerate(client_states):
        unknown = [k for k in state if k not in global_state]
        if unknown:
            raise ValueError(f"client state {i} has key {unknown[0]!r} that the global state lacks")
        for layer in sorted({layer_of(k) for k in state}):
            missing = keys_of_layer[layer] - set(state)
            if missing:
                raise ValueError(f"client state {i} sent layer {layer} only in part: missing {sorted(missing)[0]!r}")
            participants[layer].append(i)

    result = {key: value.detach().clone() for key, value in global_state.items()}
    for layer, clients in participants.items():
        if not clients:
            continue  # nobody trained this layer: keep the global value
        layer_weights = [w[i] for i in clients]
        if sum(layer_weights) <= 0.0:
            raise ValueError(f"layer {layer}: its clients {clients} all have weight 0")
        for key in keys_of_layer[layer]:
            result[key] = weighted_average([client_states[i][key] for i in clients], layer_weights)
    return result
