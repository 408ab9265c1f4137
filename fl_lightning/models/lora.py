"""LoRA by depth on a vision transformer (FeDiSyn's federated fine-tuning), wired with peft.

In FeDiSyn's fine-tuning phase device i trains LoRA adapters only in the LAST ``x_i`` transformer
blocks of the server's pre-trained ViT; the server then averages each block's adapters over the
devices that trained it (``fl_lightning.federation.aggregate.layerwise_average``).

Two ways to give a model "LoRA in the last x blocks" are provided, and both are tested:

* :func:`apply_lora` with ``layers=last_blocks(x, depth)`` — peft's ``layers_to_transform``: the
  adapters exist only in those blocks. Changing ``x`` means wrapping a fresh backbone.
* :func:`apply_lora` with ``layers=None`` (adapters in ALL blocks) followed by
  :func:`set_trainable_depth` — adapters everywhere, but only those of the last ``x`` blocks have
  ``requires_grad``. **This is the variant the federation uses** (``LoRAClassifier``): each rank
  builds its model once and, per client, only swaps LoRA state and toggles ``requires_grad`` — no
  backbone is re-wrapped. Frozen adapters of lower blocks still take part in the forward pass with
  the global values, exactly as a device holding the whole global model but training only its last
  ``x_i`` blocks would.

Wire format: :func:`get_lora_state` returns peft's adapter state dict (``get_peft_model_state_dict``)
with the wrapper prefix ``base_model.model.`` removed, so keys read like the bare backbone's own
parameter paths, e.g. ``blocks.11.attn.qkv.lora_A.weight``. A key names one block's adapter whatever
the depth of the client that holds it, so server and client states share keys and a partial state
(only the blocks a client trained) is a sub-dict of the global one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "LoraSpec",
    "last_blocks",
    "apply_lora",
    "set_trainable_depth",
    "is_lora_param",
    "lora_layer_index",
    "lora_layer_indices",
    "get_lora_state",
    "set_lora_state",
    "lora_state_by_layer",
    "lora_bits_per_layer",
]

# peft's PeftModel keeps the user's module at ``.base_model.model``; its state-dict keys carry this.
_PEFT_PREFIX = "base_model.model."
# Block containers of timm (``blocks``) and open_clip (``transformer.resblocks``) vision towers.
_DEFAULT_PATTERNS: tuple[str, ...] = ("blocks", "resblocks")


@dataclass(frozen=True)
class LoraSpec:
    """What a LoRA adapter looks like (everything except where it goes in depth).

    Args:
        rank: LoRA rank r (the paper's adapters use r=8).
        alpha: LoRA scaling numerator; the update is ``(alpha / rank) * B @ A``.
        dropout: dropout on the adapter input.
        target_modules: dotted module-name suffixes inside a block. Dotted on purpose: a bare
            ``proj`` would also catch timm's ``patch_embed.proj``. For open_clip towers use ``attn``
            (``nn.MultiheadAttention``; LoRA on in_proj and out_proj together).
    """

    rank: int = 8
    alpha: float = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("attn.qkv", "attn.proj")

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank={self.rank!r} is not allowed; expected an int >= 1")
        if not self.alpha > 0:
            raise ValueError(f"alpha={self.alpha!r} is not allowed; expected a number > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} is not allowed; expected a float in [0, 1)")
        if not self.target_modules:
            raise ValueError(f"target_modules={self.target_modules!r} is not allowed; expected a non-empty list of module names")


def last_blocks(num_blocks: int, depth: int) -> list[int]:
    """Indices of the last ``num_blocks`` of a ``depth``-block transformer (the paper's x_i).

    >>> last_blocks(3, 12)
    [9, 10, 11]
    """
    if not 0 <= num_blocks <= depth:
        raise ValueError(f"depth={num_blocks!r} is not allowed; expected an int in [0, {depth}] (the model has {depth} blocks)")
    return list(range(depth - num_blocks, depth))


def apply_lora(
    model: nn.Module,
    *,
    spec: LoraSpec,
    layers: Sequence[int] | None,
    layers_pattern: str = "blocks",
    modules_to_save: Sequence[str] | None = None,
) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters in the given blocks; everything else is frozen.

    Args:
        model: a bare backbone (timm ViT, open_clip visual tower, ...). It is modified in place
            and becomes ``returned.base_model.model``.
        spec: adapter shape and target modules.
        layers: block indices that get adapters (peft's ``layers_to_transform``), or ``None`` for
            all blocks (then use :func:`set_trainable_depth` to choose which train).
        layers_pattern: name of the block container (``blocks`` for timm, ``resblocks`` for open_clip).
        modules_to_save: modules outside the blocks that peft should train and save (e.g. ``["head"]``).

    Returns:
        a ``peft.PeftModel`` whose forward is the backbone's forward.
    """
    from peft import LoraConfig, get_peft_model  # deferred: peft pulls in transformers (slow import)

    if layers is not None and len(layers) == 0:
        # peft treats an empty layers_to_transform as "all layers": refuse instead of surprising.
        raise ValueError(
            f"layers={list(layers)!r} is not allowed; expected a non-empty list of block indices, or None for all blocks"
        )
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        layers_to_transform=None if layers is None else [int(i) for i in layers],
        layers_pattern=None if layers is None else layers_pattern,
        modules_to_save=None if modules_to_save is None else list(modules_to_save),
    )
    return get_peft_model(model, config)


def is_lora_param(name: str) -> bool:
    """True for a LoRA adapter parameter / state key (peft names them ``lora_A``, ``lora_B``, ...)."""
    return ".lora_" in name


def lora_layer_index(param_name: str, *, patterns: Sequence[str] = _DEFAULT_PATTERNS) -> int:
    """Block index of a parameter or state key, e.g. ``...blocks.7.attn.qkv.lora_A...`` -> 7.

    Works on any prefix (``model.base_model.model.``, ``_forward_module.``, ...).

    Raises:
        ValueError: the name contains no ``<pattern>.<int>.`` segment.
    """
    alternatives = "|".join(re.escape(p) for p in patterns)
    match = re.search(rf"(?:^|\.)(?:{alternatives})\.(\d+)\.", param_name)
    if match is None:
        raise ValueError(f"no block index in parameter name {param_name!r} (looked for {list(patterns)}.<int>.)")
    return int(match.group(1))


def lora_layer_indices(model: nn.Module) -> list[int]:
    """Sorted block indices that hold LoRA adapters in ``model``."""
    return sorted({lora_layer_index(n) for n, _ in model.named_parameters() if is_lora_param(n)})


def set_trainable_depth(model: nn.Module, depth: int, *, num_blocks: int | None = None) -> list[int]:
    """Train only the LoRA adapters of the last ``depth`` blocks; freeze the others.

    Frozen adapters get ``requires_grad=False`` and their ``.grad`` cleared, so neither a backward
    pass nor a stale gradient from a previous client can move them. Non-LoRA parameters are left
    as they are (a trainable head stays trainable).

    Args:
        model: a model wrapped by :func:`apply_lora` with adapters in all blocks.
        depth: the paper's x_i, number of last blocks to train (0 trains no adapter).
        num_blocks: total number of blocks; default: one past the highest block holding LoRA.

    Returns:
        the trained block indices.
    """
    if num_blocks is None:
        indices = lora_layer_indices(model)
        if not indices:
            raise ValueError("the model has no LoRA adapters: wrap it with apply_lora first")
        num_blocks = indices[-1] + 1
    trained = set(last_blocks(depth, num_blocks))
    for name, param in model.named_parameters():
        if not is_lora_param(name):
            continue
        train = lora_layer_index(name) in trained
        param.requires_grad_(train)
        if not train:
            param.grad = None
    return sorted(trained)


def _strip(key: str) -> str:
    return key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key


def get_lora_state(model: nn.Module, *, layers: Iterable[int] | None = None) -> dict[str, torch.Tensor]:
    """The LoRA adapters of ``model`` in the wire format (detached clones).

    Args:
        model: a model wrapped by :func:`apply_lora`.
        layers: keep only these block indices (a client uploads the blocks it trained); default all.

    Returns:
        ``{canonical key: tensor}``, keys like ``blocks.11.attn.qkv.lora_A.weight``.
    """
    from peft import get_peft_model_state_dict

    keep = None if layers is None else set(layers)
    state: dict[str, torch.Tensor] = {}
    for key, value in get_peft_model_state_dict(model).items():
        if not is_lora_param(key):  # modules_to_save entries travel separately
            continue
        if keep is not None and lora_layer_index(key) not in keep:
            continue
        state[_strip(key)] = value.detach().clone()
    return state


def set_lora_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load (possibly partial) wire-format LoRA state into ``model``; other adapters keep their values.

    Raises:
        ValueError: a key names an adapter that ``model`` does not have (e.g. a block outside
            its ``layers_to_transform``) — silently dropping it would lose an update.
    """
    from peft import set_peft_model_state_dict

    prefixed = {_PEFT_PREFIX + _strip(k): v for k, v in state.items()}
    result = set_peft_model_state_dict(model, prefixed)
    unexpected = [k for k in result.unexpected_keys if is_lora_param(k)]
    if unexpected:
        raise ValueError(f"LoRA state has {len(unexpected)} key(s) this model lacks, e.g. {_strip(unexpected[0])!r}")


def lora_state_by_layer(state: Mapping[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    """Group a LoRA state by block index: ``{block: {key: tensor}}`` (sorted by block)."""
    grouped: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        grouped.setdefault(lora_layer_index(key), {})[key] = value
    return dict(sorted(grouped.items()))


def lora_bits_per_layer(state: Mapping[str, torch.Tensor], *, bits_per_param: int = 32) -> int:
    """Bits to transmit one block's LoRA adapters (the paper's per-layer payload, so x_i layers cost x_i times this).

    Raises:
        ValueError: the state is empty or its blocks hold different numbers of parameters.
    """
    counts = {layer: sum(t.numel() for t in tensors.values()) for layer, tensors in lora_state_by_layer(state).items()}
    if not counts:
        raise ValueError("empty LoRA state: no layer to size")
    if len(set(counts.values())) != 1:
        raise ValueError(f"LoRA blocks differ in size (parameters per block: {counts})")
    return next(iter(counts.values())) * bits_per_param
