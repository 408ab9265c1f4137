"""What crosses the simulated network: ``Upload`` and ``Download`` values that know their size.

Nothing else is shared between a client and the server, which keeps traffic accounting exact and
the privacy story honest (a client's raw data never leaves its own code path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["Payload", "Upload", "Download", "UploadRejected", "check_upload", "SCALAR_BYTES"]

SCALAR_BYTES = 8  # a metadata scalar (e.g. a sample count) travels as one 64-bit value


@dataclass
class Payload:
    """Named tensors plus a few scalars (counts, flags) that travel between client and server."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    meta: dict[str, float | int] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values()) + SCALAR_BYTES * len(self.meta)

    def to(self, device: torch.device | str) -> Payload:
        return type(self)({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta))

    def state_dict(self) -> dict:
        """A ``torch.load(weights_only=True)``-safe form (tensors, str, numbers only)."""
        return {"tensors": {k: v.detach().cpu() for k, v in self.tensors.items()}, "meta": dict(self.meta)}

    @classmethod
    def from_state_dict(cls, state: dict) -> Payload:
        return cls(dict(state["tensors"]), dict(state["meta"]))


class Upload(Payload):
    """Client → server."""


class Download(Payload):
    """Server → client."""


class UploadRejected(ValueError):
    """An upload with a missing tensor, a wrong shape or non-finite values."""


def _all_finite(t: Tensor) -> bool:
    """No NaN or ±inf in ``t``: min and max propagate both, in one pass and without a (numel,) mask."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.detach())
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def check_upload(upload: Upload, expected_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Reject an upload whose tensors are missing, mis-shaped or non-finite.

    Args:
        upload: what a client sent.
        expected_shapes: name → shape the server expects (None: only the finiteness check).
    """
    tensors = upload.tensors
    for name, shape in (expected_shapes or {}).items():
        t = tensors.get(name)
        if t is None:
            raise UploadRejected(f"missing tensor {name!r}")
        if t.shape != tuple(shape):
            raise UploadRejected(f"tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    for name, t in tensors.items():
        if t.is_floating_point() and not _all_finite(t):
            raise UploadRejected(f"tensor {name!r} has non-finite values")
    for name, v in upload.meta.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UploadRejected(f"scalar {name!r} is not finite")
