"""The engine's side of a method on a frozen backbone's features (AFL, FedCGS, FedPFT, FedAvg of a head): the
backbone held on each rank, its input spec, and the training split's feature table, whose rows a client reads.

:class:`FeatureTableMethod` holds the tables (:class:`~fl_lightning.algorithms.common.FrozenFeatures`, computed once
per comparison); :class:`OneShotFeatureMethod` adds the one round of AFL, FedCGS and FedPFT, in which nothing is
downloaded. What a method adds is its client's upload, the server's head and its evaluation; the math is in the
parts a method holds (AFL's and FedCGS's :class:`~fl_lightning.algorithms.afl.AnalyticHead`), never here.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning.fabric import Fabric

from fl_lightning.algorithms.common import FrozenFeatures, held_backbone
from fl_lightning.federation.algorithm import Algorithm, Environment, InputSpec, RoundHistory, RoundPlan, State
from fl_lightning.federation.transport import Download

__all__ = ["FeatureTableMethod", "OneShotFeatureMethod"]


class FeatureTableMethod(Algorithm):
    """``self.backbone``, frozen and built on each rank; after :meth:`setup`, ``self._tables`` and the training
    split's feature table ``self._train_h`` (N × d, on the CPU in dataset order)."""

    shared_evaluation = True  # evaluate(state) is the test split through common.py: every rank its shard

    def build(self, fabric: Fabric) -> None:
        self.backbone = held_backbone(self.cfg, fabric)  # CUDA + mixed: in bf16/fp16

    def input_spec(self) -> InputSpec:
        return InputSpec.of_backbone(self.backbone, self.cfg.data.image_size)

    def setup(self, env: Environment) -> None:
        super().setup(env)
        self._tables = FrozenFeatures(self, self.backbone)  # the frozen backbone's features, once per comparison
        self._train_h = self._tables.table("train", all_ranks=True)


class OneShotFeatureMethod(FeatureTableMethod):
    """One round on the feature tables: the server's state starts empty and a client downloads nothing."""

    @property
    def num_rounds(self) -> int:
        return 1

    def initial_state(self) -> State:
        return {}

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return RoundPlan({c: Download() for c in clients})  # clients hold the frozen backbone: nothing to send
