"""DENSE / Co-Boosting's teachers split over the ranks: each rank runs its shard of the K client models.

The server's data-free distillation (:mod:`fl_lightning.modules.data_free_kd`) spends its time in the ensemble
A(x) = Σ_k w_k f_k(x) / Σ_k w_k: every generator step runs the K teachers forward and backward (L_G's gradient
reaches G through them), every distillation batch runs them forward (and backward for Co-Boosting's ODS step).
:class:`SplitEnsemble` is :class:`~fl_lightning.modules.data_free_kd.WeightedEnsemble` with that K-fold work dealt
over the N ranks of the default process group: rank r holds teachers [r·K/N, (r+1)·K/N) (``Deal(r, N).blocks(K)``,
contiguous; a rank may hold none when K < N). Everything else — G, z, the student S, the losses, the optimisers,
the random draws — is replicated: every rank runs the same seeded steps on the same (gathered) values, so every
rank holds the same G and S bit for bit, and the ensemble's input x is the same tensor on every rank.

Per ensemble call (:class:`_Members`):

* forward: each rank runs its teachers on x (and, inside :meth:`SplitEnsemble.bn_statistics`, records their
  BatchNorm terms r_l of L_BN); one all-gather brings every teacher's logits (B, C) and BN terms to every rank,
  stacked in teacher order: the (K, B, C) tensor one rank's ``torch.stack([f_k(x)])`` gives, the same values, so
  the combination, the losses and their gradients are one rank's on every rank.
* backward: every rank holds the same gradient w.r.t. the gathered logits and terms; each takes its teachers'
  slices back through its teachers to x (one ``autograd.grad`` over its teachers, each reading its own leaf copy
  of x), and one all-gather brings every teacher's input gradient g_k (B, C_in, S, S) to every rank. The
  function returns them as the gradients of K separate inputs (x passed K times, teacher K first), so autograd
  adds them into x's gradient as it does on one rank: one rank's backward runs each teacher's subgraph whole,
  teacher K first (its nodes are the newest), after whatever consumer of x came later (S's forward in L_G), and
  accumulates ((g_S + g_K) + g_{K-1}) + … + g_1; the split accumulates the same terms in the same order.

Bitwise: the logits, L_G, G's gradients and steps, S's distillation steps equal one rank's bit for bit
(``tests/modules/test_data_free_kd_ranks.py``, K = 3 teachers on 2 gloo processes), given deterministic kernels,
as long as each teacher reads its input once (a conv stem: every timm/CIFAR CNN here). A teacher that reads x
twice adds its two contributions into x before x's other terms on one rank and after them here: round-off.

Replicas that cannot drift: bit-identical replicas need deterministic kernels, which a GPU run without
``federation.deterministic`` does not have (cuDNN picks its algorithms). The per-rank branches on replicated values
(which synthesis step's images to keep, whether any) then take rank 0's decision
(:meth:`SplitEnsemble.rank0_batch`), and each server epoch ends with rank 0's student and ensemble weights on every
rank (:meth:`SplitEnsemble.rank0_state`): the result is rank 0's run, and the collectives never fall out of step.
Where the replicas agree (the CPU, deterministic kernels) neither changes a bit.

What crosses the collective per call (float32 unless said): forward, per rank max_r(1 + K_r·B·C + T_r) values
(K_r teachers, T_r their BN terms; the 1 carries the logits' dtype); backward (when x needs a gradient),
max_r K_r · |x| values of x's dtype (|x| = B·C_in·S·S; 3 MB per teacher at DENSE's B = 256 on 32-px images).
Every rank receives N times that. On NCCL the tensors stay on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fl_lightning.dealing import Deal
from fl_lightning.federation.ranks.collectives import waiting
from fl_lightning.modules.data_free_kd import BNStatistics, combine_logits

__all__ = ["SplitEnsemble"]

_KEY = "federation.compute_timeout_s"  # its collectives run in lockstep: the compute group's short timeout
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # the logits' dtype travels as its index


def _autocast_cast(x: Tensor) -> torch.dtype | None:
    """The dtype autocast casts ``x`` to once and caches for every op that reads it (a float32 leaf that needs a
    gradient, under an enabled autocast with its cache), else None. On one rank the teachers then share that one
    cast: their input gradients are added in its dtype, teacher K first, and cast to float32 once."""
    device = x.device.type
    if (
        x.is_leaf
        and x.dtype == torch.float32
        and not x._is_view()
        and torch.is_autocast_enabled(device)
        and torch.is_autocast_cache_enabled()
    ):
        return torch.get_autocast_dtype(device)
    return None


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class SplitEnsemble(nn.Module):
    """A(x) = Σ_k w_k f_k(x) / Σ_k w_k with the K teachers dealt over the ranks (the module docstring).

    Every rank constructs it together (one all-gather of the teachers' BatchNorm layer counts) and calls it with
    the same inputs in the same order: each call is a collective.

    Args:
        models: this rank's teachers, ``Deal(rank, world).blocks(num_members)`` (kept in eval mode by the caller).
        weights: (K,) non-negative, positive sum, the same on every rank; ``None`` for the plain mean.
        num_members: K, all ranks' teachers.
        num_classes: C, the logits' width (a rank without teachers needs it).
        timeout_s: ``federation.compute_timeout_s``, for a timed-out gather's message (the default process group's
            own timeout applies: its collectives are compute collectives, every rank in lockstep).

    Example (one process: the plain ensemble)::

        >>> ens = SplitEnsemble([nn.Linear(4, 3), nn.Linear(4, 3)], num_members=2, num_classes=3)
        >>> ens(torch.zeros(5, 4)).shape
        torch.Size([5, 3])
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        weights: Tensor | None = None,
        *,
        num_members: int,
        num_classes: int,
        timeout_s: float = 900.0,
    ) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        self.rank, self.world = _rank_world()
        self.shards = [Deal(r, self.world).blocks(num_members) for r in range(self.world)]  # in teacher order
        if len(models) != len(self.shards[self.rank]):
            raise ValueError(
                f"rank {self.rank} holds teachers {self.shards[self.rank]} of {num_members}, got {len(models)} models"
            )
        self.members = nn.ModuleList(models)
        self.num_members, self.num_classes = num_members, num_classes
        self.weights = torch.ones(num_members) if weights is None else weights
        counts = [sum(isinstance(m, nn.BatchNorm2d) for m in f.modules()) for f in models]
        self._bn_layers = self._all_objects(sum(counts))  # BN layers per rank, in rank order
        self._recording: BNStatistics | None = None  # this rank's hooks while bn_statistics() is open
        self._terms: Tensor | None = None  # every teacher's BN terms of the last forward (T,), in teacher order

    # -- the ensemble ---------------------------------------------------------------------------
    def member_logits(self, x: Tensor) -> Tensor:
        """Every teacher's logits (K, B, C), in teacher order (as ``torch.stack([f_k(x) for k])``)."""
        grad = torch.is_grad_enabled() and x.requires_grad
        cast = _autocast_cast(x) if grad else None
        copies = [x] * self.num_members if grad and cast is None else [x]
        logits, terms = _Members.apply(self, grad, cast, *copies)
        self._terms = terms if self._recording is not None else None
        return logits

    def forward(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        return combine_logits(self.member_logits(x), self.weights if weights is None else weights)

    def bn_statistics(self) -> _SplitBNStatistics:
        """L_BN over every teacher's BatchNorm layers (a context, as :class:`BNStatistics`): each rank hooks its own,
        the terms are gathered with the logits and summed in teacher order."""
        return _SplitBNStatistics(self)

    # -- rank 0's decisions --------------------------------------------------------------------------
    def rank0_batch(self, images: Tensor | None, labels: Tensor, shape: tuple[int, ...]) -> Tensor | None:
        """The synthesis's kept batch of rank 0 (or its None: no finite L_G) on every rank.

        Every rank runs the same seeded synthesis, but which step's images it keeps (``loss < best_loss``) and
        whether it keeps any are per-rank branches on values computed by this rank's own generator and student:
        with non-deterministic kernels (cuDNN without ``federation.deterministic``) they may differ at round-off,
        and one rank's pool would then hold other images — or no batch where the others distil (collectives out
        of step: a hang). Rank 0's choice is the result (one rank's run); the broadcast costs |x| values per server
        epoch and changes no bit when the replicas agree.

        Args:
            images: this rank's kept batch (B, C, S, S) float32, or None.
            labels: the batch's labels (the seeded draw: the same on every rank).
            shape: the batch's shape, for a rank that kept none.
        """
        if self.world == 1:
            return images
        flag = torch.tensor([images is not None], dtype=torch.int32, device=labels.device)
        with waiting("rank 0's kept batch", self.timeout_s, self.rank, key=_KEY):
            dist.broadcast(flag, src=0)
            if not int(flag.item()):
                return None
            out = (images if images is not None else torch.empty(shape, device=labels.device)).contiguous()
            dist.broadcast(out, src=0)
        return out

    def rank0_state(self, *modules: nn.Module) -> None:
        """Every parameter and buffer of ``modules`` (the student) and the ensemble's weights set to rank 0's, in
        place: replicas that drifted at round-off (non-deterministic kernels) start the next server epoch as one."""
        if self.world == 1:
            return
        tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        weights = self.weights.to(tensors[0].device if tensors else self.weights.device).clone().contiguous()
        with waiting("rank 0's student", self.timeout_s, self.rank, key=_KEY):
            for t in tensors:
                dist.broadcast(t.data, src=0)
            dist.broadcast(weights, src=0)
        self.weights = weights.to(self.weights.device, self.weights.dtype)

    # -- what crosses -----------------------------------------------------------------------------
    def _all_objects(self, value: Any) -> list[Any]:
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        with waiting("the split ensemble's set-up", self.timeout_s, self.rank, key=_KEY):
            dist.all_gather_object(out, value)
        return out

    def _gather(self, flat: Tensor, sizes: list[int]) -> list[Tensor]:
        """Each rank's 1-D ``flat`` (rank r's of length ``sizes[r]``) on every rank, in rank order."""
        if self.world == 1:
            return [flat]
        buf = flat.new_zeros(max(sizes))
        buf[: flat.numel()] = flat
        out = [torch.empty_like(buf) for _ in range(self.world)]
        with waiting("the split ensemble's teachers", self.timeout_s, self.rank, key=_KEY):  # the bench counts this wait
            dist.all_gather(out, buf)
        return [o[:n] for o, n in zip(out, sizes)]


class _SplitBNStatistics:
    """:class:`BNStatistics` of a :class:`SplitEnsemble`: this rank's hooks, every teacher's terms."""

    def __init__(self, ensemble: SplitEnsemble) -> None:
        self.ensemble, self._local = ensemble, BNStatistics(list(ensemble.members))

    def __enter__(self) -> _SplitBNStatistics:
        self._local.__enter__()
        self.ensemble._recording = self._local
        return self

    def __exit__(self, *exc: object) -> None:
        self.ensemble._recording = None
        self._local.__exit__(*exc)

    def loss(self) -> Tensor:
        terms = self.ensemble._terms
        if terms is None or terms.numel() == 0:
            raise ValueError("no BatchNorm2d layer saw a forward pass (are there any in the models?)")
        return terms.sum()  # one rank: torch.stack([r_l in teacher order]).sum(), the same vector


class _Members(torch.autograd.Function):
    """(ensemble, x × K or × 1) → every teacher's logits (K, B, C) and BN terms (T,); the module docstring."""

    @staticmethod
    def forward(
        ctx: Any, ensemble: SplitEnsemble, grad: bool, cast: torch.dtype | None, *copies: Tensor
    ) -> tuple[Tensor, Tensor]:
        x = copies[0]
        recording = ensemble._recording
        with torch.enable_grad() if grad else torch.no_grad():
            # one leaf per teacher: its own g_k (in autocast's cached dtype where one rank's teachers share a cast)
            leaves = [(x.detach() if cast is None else x.detach().to(cast)).requires_grad_(grad) for _ in ensemble.members]
            logits = [f(leaf) for f, leaf in zip(ensemble.members, leaves)]  # K_r × (B, C)
            terms = list(recording._terms.values()) if recording is not None else []  # this forward's, in order
        if recording is not None:
            recording._terms.clear()
            if len(terms) != ensemble._bn_layers[ensemble.rank]:
                raise ValueError(
                    f"{len(terms)} of this rank's {ensemble._bn_layers[ensemble.rank]} BatchNorm layers "
                    "saw the forward; every layer must"
                )
        b, c = x.shape[0], ensemble.num_classes
        dtype = logits[0].dtype if logits else torch.float32
        code = torch.tensor([float(_DTYPES.index(dtype) if logits else -1)], device=x.device)
        flat = torch.cat(
            [code, *(z.detach().float().reshape(-1) for z in logits), *(t.detach().float().reshape(1) for t in terms)]
        )
        t_of = ensemble._bn_layers if recording is not None else [0] * ensemble.world
        sizes = [1 + len(s) * b * c + t for s, t in zip(ensemble.shards, t_of)]
        parts = ensemble._gather(flat, sizes)
        codes = [int(p[0]) for p in parts if int(p[0]) >= 0]
        out_dtype = _DTYPES[codes[0]] if codes else torch.float32
        all_logits = torch.cat([p[1 : 1 + len(s) * b * c] for p, s in zip(parts, ensemble.shards)])
        all_terms = torch.cat([p[1 + len(s) * b * c :] for p, s in zip(parts, ensemble.shards)])
        if grad:
            ctx.ensemble, ctx.leaves, ctx.logits, ctx.terms = ensemble, leaves, logits, terms
            ctx.input_shape, ctx.input_dtype, ctx.cast = x.shape, x.dtype, cast
        return all_logits.to(out_dtype).reshape(ensemble.num_members, b, c), all_terms

    @staticmethod
    def backward(ctx: Any, grad_logits: Tensor | None, grad_terms: Tensor | None) -> tuple[Tensor | None, ...]:
        ens: SplitEnsemble = ctx.ensemble
        mine = ens.shards[ens.rank]
        outputs, grads = list(ctx.logits), []
        for k in mine:
            grads.append(torch.zeros_like(ctx.logits[0]) if grad_logits is None else grad_logits[k])
        if ctx.terms:
            first = sum(ens._bn_layers[: ens.rank])
            outputs += ctx.terms
            grads += [
                torch.zeros_like(t) if grad_terms is None else grad_terms[first + i].reshape(t.shape)
                for i, t in enumerate(ctx.terms)
            ]
        if outputs:
            found = torch.autograd.grad(outputs, ctx.leaves, grads, allow_unused=True)
            local = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(found, ctx.leaves)]
        else:
            local = []
        numel, dtype = ctx.input_shape.numel(), ctx.cast or ctx.input_dtype
        device = grad_logits.device if grad_logits is not None else grad_terms.device
        flat = torch.cat([g.reshape(-1) for g in local]) if local else torch.zeros(0, dtype=dtype, device=device)
        parts = ens._gather(flat, [len(s) * numel for s in ens.shards])
        per_teacher = torch.cat(parts).reshape(ens.num_members, *ctx.input_shape)  # g_1 … g_K
        ctx.leaves = ctx.logits = ctx.terms = None
        if ctx.cast is None:  # x was passed K times, teacher K first: autograd adds g_K, g_{K-1}, … into x's gradient
            return (None, None, None, *per_teacher.flip(0).unbind(0))
        total = per_teacher[-1]  # one rank: the shared cast's buffer adds g_K, g_{K-1}, … in its dtype, then casts
        for g in per_teacher[:-1].flip(0):
            total = total + g
        return None, None, None, total.to(ctx.input_dtype)
