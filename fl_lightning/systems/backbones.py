"""Architecture constants of the ViTs the FeDiSyn system model prices: MACs, parameters, LoRA, activations.

Every number is arithmetic on the architecture (width D, depth L, heads, patch, image side), so each
backbone is priced by the same formulas and a test can check them against the published figures:

* tokens N = (side / patch)² + 1 (the class token);
* forward multiply-accumulates per image (the "GFLOPs" timm and fvcore report are MACs):

      MACs = L · (N · (4 D² + 2 · r_mlp D²) + 2 N² D) + patch-embedding 3 p² D (N − 1)

  i.e. per block qkv (3 N D²) + proj (N D²) + fc1 and fc2 (2 r_mlp N D²) + QKᵀ and AV (2 N² D).
  ViT-B/16 at 224: 17.56 G (timm's table: 17.6); ViT-L/16: 61.55 G (timm: 61.6);
* parameters: per block qkv, proj, fc1, fc2 (weights and biases) and two LayerNorms, plus the patch
  embedding, class token, position embedding, final norm and head; ViT-B/16 with the 1000-class head
  86,567,656 and ViT-L/16 304,326,632 — exactly timm's counts (86.6 M, 304.3 M);
* LoRA of rank r on ``attn.qkv`` (D → 3D) and ``attn.proj`` (D → D): r (D + 3D) + r (D + D) = 6 r D
  parameters per block (ViT-B, r = 8: 36,864; ViT-L: 49,152);
* activations a trainable block saves for backward, per image (float32, fused SDPA: no N × N matrix
  is kept): the inputs of norm1, qkv, SDPA's q, k, v and output, proj, norm2, fc1, GELU and fc2
  ≈ 17 N D floats (ViT-B: 10.3 MB, ViT-L: 13.7 MB). An upper bound: a frozen Linear needs no saved
  input for its (absent) weight gradient.

The model the paper's devices run is the one *named* (``pretrain_model``): a tiny test model built
with ``pretrain_overrides`` is priced as the backbone it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backbone", "BACKBONES", "backbone", "head_params", "lora_params_per_block"]

_ACTIVATION_FLOATS_PER_TOKEN_DIM = 17  # saved tensors of one block, in units of N·D (module docstring)
_BYTES_FP32 = 4


@dataclass(frozen=True)
class Backbone:
    """A plain ViT (timm ``VisionTransformer``) at its native resolution.

    Args:
        name: timm model name.
        embed_dim: D.
        depth: L, transformer blocks.
        num_heads: attention heads.
        patch_size: p.
        image_size: input side (px).
        mlp_ratio: hidden width of the MLP over D.
    """

    name: str
    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 16
    image_size: int = 224
    mlp_ratio: float = 4.0

    @property
    def tokens(self) -> int:
        """N = (side / patch)² + 1 (class token)."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def forward_macs(self) -> float:
        """Multiply-accumulates of one image's forward pass (what timm's table calls GFLOPs)."""
        N, D, r = self.tokens, self.embed_dim, self.mlp_ratio
        block = N * (4 * D * D + 2 * r * D * D) + 2 * N * N * D
        patch = 3 * self.patch_size**2 * D * (N - 1)
        return float(self.depth * block + patch)

    def params(self, num_classes: int) -> int:
        """Parameters with a ``num_classes`` head (weights and biases, norms, embeddings)."""
        D, L, hidden = self.embed_dim, self.depth, int(self.mlp_ratio * self.embed_dim)
        block = (D * 3 * D + 3 * D) + (D * D + D) + (D * hidden + hidden) + (hidden * D + D) + 4 * D  # + 2 LayerNorms
        embed = 3 * self.patch_size**2 * D + D + D + self.tokens * D  # patch conv + bias, cls, pos
        return int(L * block + embed + 2 * D + head_params(D, num_classes))

    def activation_bytes_per_block(self) -> float:
        """Bytes one trainable block saves for backward per image (float32, ≈ 17 N D floats)."""
        return float(_ACTIVATION_FLOATS_PER_TOKEN_DIM * self.tokens * self.embed_dim * _BYTES_FP32)


def head_params(embed_dim: int, num_classes: int) -> int:
    """A linear head's parameters, D·C + C."""
    return embed_dim * num_classes + num_classes


def lora_params_per_block(embed_dim: int, rank: int) -> int:
    """LoRA of rank r on attn.qkv (D → 3D) and attn.proj (D → D): r(D + 3D) + r(D + D) = 6 r D."""
    return 6 * rank * embed_dim


BACKBONES: dict[str, Backbone] = {
    "vit_tiny_patch16_224": Backbone("vit_tiny_patch16_224", embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": Backbone("vit_small_patch16_224", embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": Backbone("vit_base_patch16_224", embed_dim=768, depth=12, num_heads=12),  # CIFAR-10, Caltech-101
    "vit_large_patch16_224": Backbone("vit_large_patch16_224", embed_dim=1024, depth=24, num_heads=16),  # Food-101
}
"""The backbones the system model prices, by timm name (the paper's are ViT-B/16 and ViT-L/16)."""


def backbone(name: str) -> Backbone:
    """The :class:`Backbone` of a timm model name (a ``.tag`` suffix is ignored).

    Raises:
        ValueError: the name is not in :data:`BACKBONES`.
    """
    base = name.split(".")[0]
    if base not in BACKBONES:
        raise ValueError(f"no system-model constants for {name!r}; known: {sorted(BACKBONES)}")
    return BACKBONES[base]
