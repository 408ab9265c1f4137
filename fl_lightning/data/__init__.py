"""Data sets, preprocessing, client partitions and partition reports.

* :mod:`.registry` — ``build_dataset(name, root=..., ...)`` -> :class:`DatasetSplits`.
* :mod:`.transforms` — ``build_transform(normalization=..., image_size=..., train=...)``.
* :mod:`.partition` — pure, seeded Dirichlet / IID / shard splits among clients.
* :mod:`.report` — ``partition.csv`` and ``partition.png`` of a split.
"""

from fl_lightning.data.partition import (
    client_class_counts,
    dirichlet_partition,
    iid_partition,
    shard_partition,
)
from fl_lightning.data.registry import DATASETS, DatasetSplits, build_dataset, register_dataset
from fl_lightning.data.report import partition_figure, write_partition_report
from fl_lightning.data.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NORMALIZATIONS,
    build_transform,
)

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "DATASETS",
    "DatasetSplits",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "NORMALIZATIONS",
    "build_dataset",
    "build_transform",
    "client_class_counts",
    "dirichlet_partition",
    "iid_partition",
    "partition_figure",
    "register_dataset",
    "shard_partition",
    "write_partition_report",
]
