"""Data-free knowledge distillation on the server: the pieces DENSE and Co-Boosting share.

A one-shot server holds K client classifiers f_1..f_K and no data. It trains a generator G to
synthesise inputs x = G(z) on which the (weighted) ensemble

    A(x) = Σ_k w_k f_k(x) / Σ_k w_k                                                   (ensemble)

is confident about a sampled label y and on which a student S disagrees with it, and then distils A
into S with a KL divergence on the synthetic inputs. Per epoch (DENSE, Zhang et al., NeurIPS 2022,
Alg. 1 / Eq. (3)-(6); Co-Boosting, Dai et al., ICLR 2024, Alg. 1 / Eq. (4)-(9)):

    L_G = λ_oh · CE(A(x), y) + λ_bn · L_BN(x) − λ_adv · KL(A(x) ‖ S(x))               (generator)
    L_S = KL_T(A(x) ‖ S(x))                                                            (student)

* L_BN (DeepInversion): Σ_l ‖μ_l(x) − μ̂_l‖₂ + ‖σ²_l(x) − σ̂²_l‖₂ over every BatchNorm layer of every
  client model, batch statistics against the running ones (:class:`BNStatistics`).
* DENSE's adversarial term counts only samples where S and A disagree on the arg-max
  (``mask_agreement``); Co-Boosting's counts all (:func:`adversarial_loss`).
* Co-Boosting replaces CE by the hardness-weighted (1 − p_y)^γ · CE (:func:`hardness_weighted_ce`),
  perturbs each distillation batch along a random output direction (ODS, :func:`ods_perturb`) and
  re-weights the ensemble by signed gradient steps on w (:func:`reweight_ensemble`).

Precision: the loops take an ``autocast`` factory (``fabric.autocast``) for their forwards and an optional
``GradScaler`` (``16-mixed``'s) for their backward and step, as a client's local loop does
(``federation/local_training.py``). The logits are read in float32 (the losses, the arg-max, the BN
statistics are computed in float32 whatever the forward ran in); without either, the loops are the plain
float32 ones bit for bit.

Everything here is pure torch on explicit tensors and modules: no Lightning, no files, no config
objects. The orchestration (which model, which defaults) is in ``algorithms/dense.py`` and
``algorithms/coboosting.py``; our own code, written after reading both papers and their official
repositories (zj-jayzhang/DENSE, rong-dai/Co-Boosting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Generator",
    "reset_generator",
    "BNStatistics",
    "WeightedEnsemble",
    "combine_logits",
    "kd_kl",
    "adversarial_loss",
    "hardness_weighted_ce",
    "ods_perturb",
    "reweight_ensemble",
    "random_shift_flip",
    "pool_padding",
    "SynthesisSettings",
    "synthesize",
    "distill_epoch",
]


# ------------------------------------------------------------------------------------------ generator
class Generator(nn.Module):
    """DENSE's image generator: z → Linear → (BN, ×2 up, conv-BN-LReLU) ×2 → conv → sigmoid.

    The output lies in [0, 1] (pixel space); callers normalise it with the classifiers' statistics.

    Args:
        nz: latent size (both papers: 256).
        ngf: base width (both papers: 64).
        image_size: side S of the square output; a multiple of 4.
        channels: output channels.

    Example:
        >>> Generator(nz=8, ngf=4, image_size=8)(torch.zeros(2, 8)).shape
        torch.Size([2, 3, 8, 8])
    """

    def __init__(self, *, nz: int = 256, ngf: int = 64, image_size: int = 32, channels: int = 3) -> None:
        super().__init__()
        if image_size % 4 or image_size < 4:
            raise ValueError(f"image_size must be a positive multiple of 4, got {image_size}")
        if nz < 1 or ngf < 1 or channels < 1:
            raise ValueError(f"nz, ngf and channels must be >= 1, got {nz}, {ngf}, {channels}")
        self.nz, self.init_size, self.channels = nz, image_size // 4, channels
        self.project = nn.Linear(nz, 2 * ngf * self.init_size**2)
        self.blocks = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, channels, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: Tensor) -> Tensor:
        out = self.project(z).view(z.shape[0], -1, self.init_size, self.init_size)  # (B, 2·ngf, S/4, S/4)
        return self.blocks(out)  # (B, C, S, S) in [0, 1]


@torch.no_grad()
def reset_generator(generator: nn.Module, *, rng: torch.Generator) -> None:
    """Both official codes re-draw G before every synthesis: conv/linear weights ~ N(0, 0.02²), biases 0;
    BatchNorm weights ~ N(1, 0.02²), biases 0 (DCGAN's initialisation), from ``rng``."""
    for m in generator.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            m.weight.copy_(torch.randn(m.weight.shape, generator=rng) * 0.02)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.BatchNorm2d):
            m.weight.copy_(1.0 + torch.randn(m.weight.shape, generator=rng) * 0.02)
            m.bias.zero_()


# ------------------------------------------------------------------------------------------ ensemble
class BNStatistics:
    """DeepInversion's feature-statistics loss over the BatchNorm2d layers of ``models``.

    While registered, every forward through a BN layer records
    r_l = ‖μ_l(x) − running_mean_l‖₂ + ‖σ²_l(x) − running_var_l‖₂ (biased batch variance of the
    layer's input over batch and space). :meth:`loss` is Σ_l r_l of the last forward.
    Use as a context manager so the hooks are removed.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.layers = [m for model in models for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        self._terms: dict[int, Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> BNStatistics:
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, index: int) -> Callable:
        def record(module: nn.BatchNorm2d, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            x = inputs[0].float()  # (B, C, H, W); float32 under autocast too (its square overflows fp16)
            mean = x.mean(dim=(0, 2, 3))
            var = x.permute(1, 0, 2, 3).flatten(1).var(dim=1, unbiased=False)
            self._terms[index] = torch.linalg.vector_norm(module.running_var - var) + torch.linalg.vector_norm(
                module.running_mean - mean
            )

        return record

    def loss(self) -> Tensor:
        if not self._terms:
            raise ValueError("no BatchNorm2d layer saw a forward pass (are there any in the models?)")
        return torch.stack(list(self._terms.values())).sum()


class WeightedEnsemble(nn.Module):
    """A(x) = Σ_k w_k f_k(x) / Σ_k w_k (DENSE: w = 1; Co-Boosting: learned w ≥ 0).

    Args:
        models: the K client classifiers (kept in eval mode by the caller).
        weights: (K,) non-negative, positive sum; ``None`` for the plain mean.
    """

    def __init__(self, models: Sequence[nn.Module], weights: Tensor | None = None) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)
        self.weights = torch.ones(len(models)) if weights is None else weights

    @property
    def num_members(self) -> int:
        """K, the teachers (on several ranks, :class:`~fl_lightning.modules.data_free_kd_ranks.SplitEnsemble`'s
        K counts every rank's)."""
        return len(self.members)

    def bn_statistics(self) -> BNStatistics:
        """L_BN over every teacher's BatchNorm layers, as a context (:class:`BNStatistics`)."""
        return BNStatistics(list(self.members))

    def member_logits(self, x: Tensor) -> Tensor:
        return torch.stack([f(x) for f in self.members])  # (K, B, C)

    def forward(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        return combine_logits(self.member_logits(x), self.weights if weights is None else weights)


def combine_logits(logits: Tensor, weights: Tensor) -> Tensor:
    """Σ_k w_k z_k / Σ_k w_k for logits (K, B, C) and weights (K,) → (B, C)."""
    if logits.dim() != 3 or weights.shape != (logits.shape[0],):
        raise ValueError(f"expected logits (K, B, C) and weights (K,), got {tuple(logits.shape)} and {tuple(weights.shape)}")
    w = weights.to(logits)
    return torch.einsum("k,kbc->bc", w, logits) / w.sum().clamp_min(1e-12)


# ------------------------------------------------------------------------------------------ losses
def kd_kl(student_logits: Tensor, teacher_logits: Tensor, *, temperature: float = 1.0, reduction: str = "batchmean") -> Tensor:
    """Hinton's distillation loss T²·KL(softmax(t/T) ‖ softmax(s/T)).

    ``reduction='none'`` returns the per-sample divergence (B,); ``'batchmean'`` its mean.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_q = F.log_softmax(student_logits / temperature, dim=1)
    log_p = F.log_softmax(teacher_logits / temperature, dim=1)
    per_sample = (log_p.exp() * (log_p - log_q)).sum(dim=1) * temperature**2  # (B,)
    if reduction == "none":
        return per_sample
    if reduction == "batchmean":
        return per_sample.mean()
    raise ValueError(f"reduction must be 'none' or 'batchmean', got {reduction!r}")


def adversarial_loss(student_logits: Tensor, teacher_logits: Tensor, *, temperature: float, mask_agreement: bool) -> Tensor:
    """−mean_i m_i·KL_T(A(x_i) ‖ S(x_i)): the generator maximises the student–ensemble gap.

    DENSE (Eq. (5)) keeps m_i = 1[argmax S(x_i) ≠ argmax A(x_i)] so samples the student already
    agrees on stop pushing; Co-Boosting (Eq. (6)) uses m_i = 1.
    """
    kl = kd_kl(student_logits, teacher_logits, temperature=temperature, reduction="none")
    if mask_agreement:
        kl = kl * (student_logits.argmax(1) != teacher_logits.argmax(1)).to(kl.dtype)
    return -kl.mean()


def hardness_weighted_ce(logits: Tensor, targets: Tensor, *, gamma: float) -> Tensor:
    """Co-Boosting's hard-sample synthesis loss (Eq. (5)): mean_i (1 − p_{y_i})^γ · CE_i, p = softmax(logits),
    the weight held constant (no gradient through it). γ = 0 gives the plain cross-entropy."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    ce = F.cross_entropy(logits, targets, reduction="none")  # (B,)
    p_y = F.softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1).detach()
    return ((1.0 - p_y).pow(gamma) * ce).mean()


def ods_perturb(
    images: Tensor, logits_fn: Callable[[Tensor], Tensor], *, eta: float, rng: torch.Generator, temperature: float = 4.0
) -> Tensor:
    """Co-Boosting's hard-sample enhancement (Eq. (7)), output diversified sampling (ODS):
    x' = x + η · sign(∇_x Σ_{i,c} r_{ic} softmax(A(x_i)/T)_c), r ~ U(−1, 1)^{B×C}.

    Moves each sample one signed step along a random direction in the ensemble's output space, which
    makes the batch more diverse and harder. Returns a detached tensor.
    """
    x = images.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        probs = F.softmax(logits_fn(x) / temperature, dim=1)
        r = torch.rand(probs.shape, generator=rng).to(probs) * 2.0 - 1.0
        (grad,) = torch.autograd.grad((r * probs).sum(), x)
    return (images + eta * grad.sign()).detach()


def reweight_ensemble(weights: Tensor, grad: Tensor, *, step: float) -> Tensor:
    """Co-Boosting's ensemble update (Eq. (8)-(9)): w ← clip_[0,1](w − step · sign(∇_w L_CE)).

    ``step`` is μ·δ^epoch (the official decay). The official code also clips w − w_0 to [−1, 1], which
    is implied by w, w_0 ∈ [0, 1].
    """
    return (weights - step * grad.sign()).clamp(0.0, 1.0)


def random_shift_flip(
    images: Tensor, *, rng: torch.Generator, padding: int = 4, flip: bool = True, fill: Tensor | float = 0.0
) -> Tensor:
    """CIFAR's augmentation on a batch: a random crop of the padded image (a shift by up to ``padding``
    pixels) and a random horizontal flip, per sample, differentiable in ``images``.

    ``fill`` is the padding value, a number or one per channel (C,) / (1, C, 1, 1): on normalised images
    pass the normalised black, ``normalize(0)``, so that the padding is the black border that
    ``RandomCrop(padding=4)`` adds to a [0, 1] image in both official codes."""
    b, c, h, w = images.shape
    fill = torch.as_tensor(fill, dtype=images.dtype, device=images.device).reshape(1, -1, 1, 1)
    padded = fill.expand(b, c, h + 2 * padding, w + 2 * padding).clone()
    padded[:, :, padding : padding + h, padding : padding + w] = images
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=rng)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=rng)
    rows = dy[:, None] + torch.arange(h)  # (B, H): sample i's window starts at dy[i], dx[i]
    cols = dx[:, None] + torch.arange(w)  # (B, W)
    if flip:  # a flipped view reads its window's columns right to left
        do = torch.rand(b, generator=rng) < 0.5
        cols = torch.where(do[:, None], cols.flip(1), cols)
    # every sample's window in one gather (a copy of the padded values, as the per-sample slices were)
    dev = images.device
    return padded[
        torch.arange(b, device=dev)[:, None, None, None],
        torch.arange(c, device=dev)[None, :, None, None],
        rows.to(dev)[:, None, :, None],
        cols.to(dev)[:, None, None, :],
    ]


# ------------------------------------------------------------------------------------------ loops
@dataclass(frozen=True)
class SynthesisSettings:
    """One synthesis of the server (both papers' defaults are in the algorithms' configs)."""

    steps: int  # g_steps: Adam steps on G and z
    batch_size: int  # synthetic images made per epoch
    lr: float  # lr_g (Adam, betas (0.5, 0.999))
    oh: float  # λ_oh
    bn: float  # λ_bn
    adv: float  # λ_adv
    adv_temperature: float  # T of the adversarial KL
    mask_agreement: bool  # DENSE: only samples the student gets wrong push the generator
    hardness: float | None  # Co-Boosting's γ; None: plain CE (DENSE)
    bn_per_model: bool  # Co-Boosting divides L_BN by K
    augment: bool  # DENSE: the teacher sees a shifted/flipped view
    clip_grad: float | None  # Co-Boosting clips G's gradient norm at 10


def pool_padding(image_size: int) -> int:
    """The CIFAR crop's padding at another resolution: 4 px at 32 px, i.e. S/8, at least 1."""
    return max(1, image_size // 8)


def _backward_step(
    loss: Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    scaler: torch.amp.GradScaler | None,
    clip: float | None,
    params: Callable[[], object],
) -> None:
    """``loss.backward()``, the gradient norm of ``params()`` clipped at ``clip``, ``optimizer.step()``; with a
    ``scaler`` the loss is scaled, the gradients unscaled before the clip and a non-finite step skipped."""
    if scaler is None:
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params(), max_norm=clip)
        optimizer.step()
        return
    scaler.scale(loss).backward()
    if clip is not None:
        scaler.unscale_(optimizer)  # the clip sees the true gradients
        torch.nn.utils.clip_grad_norm_(params(), max_norm=clip)
    scaler.step(optimizer)  # skipped when a gradient is inf/NaN
    scaler.update()


def synthesize(
    generator: Generator,
    ensemble: WeightedEnsemble,
    student: nn.Module,
    *,
    num_classes: int,
    settings: SynthesisSettings,
    normalize: Callable[[Tensor], Tensor],
    rng: torch.Generator,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[Tensor | None, Tensor]:
    """Train a freshly drawn G (and its inputs z) for ``settings.steps`` Adam steps on L_G and return the
    lowest-loss batch seen, as (normalised images (B, C, S, S), sampled labels (B,)), detached, float32.
    The images are None when no step's L_G was finite (NaN everywhere: e.g. bf16 logits of untrained
    clients): no batch to keep.

    ``ensemble`` is a :class:`WeightedEnsemble` or, on several ranks, a
    :class:`~fl_lightning.modules.data_free_kd_ranks.SplitEnsemble` (every rank calls this together, with the
    same ``rng`` state: G, z and the kept batch are the same on every rank).

    The client models and the student stay in eval mode (BN running statistics are the targets of L_BN
    and are not updated); only G's and z's parameters change.

    Args:
        autocast: a factory of the context the forwards of G, the ensemble and the student run under
            (``fabric.autocast``); None: none. L_G is computed in float32 from their outputs.
        scaler: a fresh ``torch.amp.GradScaler`` for ``16-mixed`` (G's steps), or None.
    """
    s = settings
    context = autocast or contextlib.nullcontext
    reset_generator(generator, rng=rng)
    generator.to(device).train()
    student.eval()
    ensemble.eval()
    z = torch.randn(s.batch_size, generator.nz, generator=rng).to(device).requires_grad_(True)
    # DENSE sorts these labels; no loss depends on their order, so we do not
    targets = torch.randint(0, num_classes, (s.batch_size,), generator=rng).to(device)
    optimizer = torch.optim.Adam([*generator.parameters(), z], lr=s.lr, betas=(0.5, 0.999))
    best_loss, best = float("inf"), None
    k = ensemble.num_members
    black = normalize(torch.zeros(1, generator.channels, 1, 1, device=device))  # padding of the view
    with ensemble.bn_statistics() if s.bn > 0 else BNStatistics([]) as bn_stats:
        for _ in range(s.steps):
            with context():
                images = normalize(generator(z))  # (B, C, S, S)
                # DENSE shifts a 32-px image by up to 4 px: 1/8 of the side, kept at other sizes
                view = (
                    random_shift_flip(images, rng=rng, padding=pool_padding(images.shape[-1]), fill=black)
                    if s.augment
                    else images
                )
                t_out = ensemble(view).float()  # (B, C)
                s_out = student(view).float() if s.adv > 0 else None
            loss_oh = (
                F.cross_entropy(t_out, targets) if s.hardness is None else hardness_weighted_ce(t_out, targets, gamma=s.hardness)
            )
            loss = s.oh * loss_oh
            if s.bn > 0:
                loss = loss + s.bn * bn_stats.loss() / (k if s.bn_per_model else 1)
            if s_out is not None:
                loss = loss + s.adv * adversarial_loss(
                    s_out, t_out, temperature=s.adv_temperature, mask_agreement=s.mask_agreement
                )
            optimizer.zero_grad(set_to_none=True)
            _backward_step(loss, optimizer, scaler=scaler, clip=s.clip_grad, params=generator.parameters)
            if float(loss.detach()) < best_loss:
                best_loss, best = float(loss.detach()), images.detach().float()
    for m in (*ensemble.members, student):
        m.zero_grad(set_to_none=True)
    return best, targets.detach()


def distill_epoch(
    student: nn.Module,
    teacher: Callable[[Tensor], Tensor],
    pool: Tensor,
    *,
    optimizer: torch.optim.Optimizer,
    batch_size: int,
    temperature: float,
    rng: torch.Generator,
    ods_eta: float | None = None,
    clip_grad: float | None = None,
    augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
    autocast: Callable[[], AbstractContextManager] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """One pass of L_S = KL_T(A(x) ‖ S(x)) over the synthetic ``pool`` (N, C, S, S), shuffled with ``rng``.

    Each batch is first augmented by ``augment(batch, rng)`` (both official codes read the pool through
    a crop + flip transform), then, with ``ods_eta``, moved by :func:`ods_perturb` (Co-Boosting).
    Returns the mean loss.

    Args:
        autocast: a factory of the context the teacher's and the student's forwards run under
            (``fabric.autocast``); None: none. The KL is computed in float32 from their logits.
        scaler: the student's ``torch.amp.GradScaler`` for ``16-mixed`` (kept across its epochs), or None.
    """
    context = autocast or contextlib.nullcontext

    def teacher_logits(x: Tensor) -> Tensor:
        with context():
            return teacher(x).float()

    order = torch.randperm(pool.shape[0], generator=rng)
    total, batches = 0.0, 0
    for start in range(0, pool.shape[0], batch_size):
        images = pool[order[start : start + batch_size]]
        if augment is not None:
            images = augment(images, rng)
        if ods_eta:
            images = ods_perturb(images, teacher_logits, eta=ods_eta, rng=rng)
        with torch.no_grad():
            t_out = teacher_logits(images)
        student.train()
        with context():
            s_out = student(images).float()
        loss = kd_kl(s_out, t_out, temperature=temperature)
        optimizer.zero_grad(set_to_none=True)
        _backward_step(loss, optimizer, scaler=scaler, clip=clip_grad, params=student.parameters)
        total, batches = total + float(loss.detach()), batches + 1
    student.eval()
    return total / max(batches, 1)
