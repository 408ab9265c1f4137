"""Data sets, preprocessing, client partitions and partition reports.

* :mod:`.registry` — ``build_dataset(name, root=..., ...)`` -> :class:`DatasetSplits`.
* :mod:`.transforms` — ``build_transform(normalization=..., image_size=..., train=...)``.
* :mod:`.hf` — Hugging Face data sets (``data.name: hf``; ``datasets`` is imported only there).
* :mod:`.partition` — pure, seeded Dirichlet / IID / shard / natural splits among clients, and
  ``write_partition_json`` / ``read_partition_json`` to save a split and bring it back.
* :mod:`.flower_partition` — flwr-datasets' Dirichlet and IID partitions, index for index.
* :mod:`.report` — ``partition.csv`` and ``partition.png`` of a split.
* :mod:`.relabelled` — a client's rows read with its labels changed (a label-flipping attacker's).
"""

from fl_lightning.data.partition import (
    PartitionArgumentError,
    client_class_counts,
    dirichlet_partition,
    iid_partition,
    natural_partition,
    read_partition_json,
    shard_partition,
    write_partition_json,
)
from fl_lightning.data.registry import DATASETS, DatasetSplits, build_dataset, register_dataset
from fl_lightning.data.report import partition_figure, partition_image, write_partition_report
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
    "PartitionArgumentError",
    "build_dataset",
    "build_transform",
    "client_class_counts",
    "dirichlet_partition",
    "iid_partition",
    "natural_partition",
    "partition_figure",
    "partition_image",
    "read_partition_json",
    "register_dataset",
    "shard_partition",
    "write_partition_json",
    "write_partition_report",
]
