"""VPT-shallow prompt insertion on a frozen ViT (FedOPAL Eq. (4)-(5); Jia et al., VPT, 2022).

Eq. (4): the input sequence of the first block becomes [x_cls, P_1..P_M, E] — M learnable prompt
tokens P ∈ R^{M×D} between the class (and any register) tokens and the patch embeddings E, after
the positional embedding (prompts carry no position). Eq. (5): the prompt-rectified feature is the
final CLS state h = pool(encode([x_cls, P, E])). Only P is trained; the backbone stays frozen.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fl_lightning.models.backbones import ViTBackbone

__all__ = ["PromptedViT", "prompt_init_bound", "init_prompts"]


def prompt_init_bound(*, patch_size: int, width: int) -> float:
    """VPT's Xavier-uniform bound over the patch dimension: v = sqrt(6 / (3·p² + D))."""
    return math.sqrt(6.0 / (3 * patch_size * patch_size + width))


def init_prompts(*, num_prompts: int, patch_size: int, width: int, seed: int) -> Tensor:
    """P_init ~ U(−v, v), shape (M, D), drawn from a private generator seeded with ``seed``.

    Every client calls this with the same seed, so all start from the identical P_init that the
    proximal term mu/2·||P − P_init||² pulls towards.
    """
    v = prompt_init_bound(patch_size=patch_size, width=width)
    generator = torch.Generator().manual_seed(seed)
    return torch.empty(num_prompts, width).uniform_(-v, v, generator=generator)  # (M, D)


class PromptedViT(nn.Module):
    """A frozen :class:`ViTBackbone` with M trainable VPT-shallow prompt tokens.

    Args:
        backbone: the trunk; it is frozen here (``requires_grad=False``, eval mode).
        num_prompts: M (FedOPAL uses 10). M = 0 gives the backbone's own features.
        seed: seed of P_init (identical across clients for the same seed).

    Example:
        >>> from fl_lightning.models.backbones import build_tiny_backbone
        >>> model = PromptedViT(build_tiny_backbone("open_clip"), num_prompts=4)
        >>> model(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 32])
    """

    def __init__(self, backbone: ViTBackbone, *, num_prompts: int = 10, seed: int = 0) -> None:
        super().__init__()
        if num_prompts < 0:
            raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
        self.backbone = backbone.freeze()
        self.num_prompts = num_prompts
        p_init = init_prompts(num_prompts=num_prompts, patch_size=backbone.patch_size, width=backbone.width, seed=seed)
        dtype = next(backbone.parameters()).dtype  # a trunk held in bf16/fp16 (CUDA, mixed): float32 master prompts
        dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        self.prompts = nn.Parameter(p_init.to(dtype))  # (M, D); insert_prompts casts them to the tokens' dtype

    @property
    def feature_dim(self) -> int:
        return self.backbone.feature_dim

    def insert_prompts(self, tokens: Tensor) -> Tensor:
        """Eq. (4): (B, P + L, D) → (B, P + M + L, D), prompts right after the P prefix tokens."""
        if self.num_prompts == 0:
            return tokens
        n = self.backbone.num_prefix_tokens
        prompts = self.prompts.to(tokens.dtype).unsqueeze(0).expand(tokens.shape[0], -1, -1)  # (B, M, D)
        return torch.cat([tokens[:, :n], prompts, tokens[:, n:]], dim=1)

    def forward(self, images: Tensor) -> Tensor:
        """Eq. (5): the prompt-rectified CLS feature h, shape (B, feature_dim)."""
        tokens = self.backbone.embed(images)  # (B, 1 + L, D)
        tokens = self.insert_prompts(tokens)  # (B, 1 + M + L, D)
        return self.backbone.pool(self.backbone.encode(tokens))

    def get_prompts(self) -> Tensor:
        """A detached copy of P, shape (M, D) (what a client uploads)."""
        return self.prompts.detach().clone()

    def set_prompts(self, prompts: Tensor) -> None:
        """Overwrite P in place (keeps the Parameter object, so optimisers stay valid)."""
        if tuple(prompts.shape) != tuple(self.prompts.shape):
            raise ValueError(f"prompts of shape {tuple(prompts.shape)} do not fit {tuple(self.prompts.shape)} (M, D)")
        with torch.no_grad():
            self.prompts.copy_(prompts)
