"""Read back what W&B and TensorBoard recorded, as their own readers see it (no network, no pyplot).

* :func:`wandb_records` parses an offline ``run-*.wandb`` file: W&B's LevelDB-style log (a 7-byte file header
  ``":W&B" 0xBEE1 0``, then 32 KiB blocks of chunks, each ``crc32 | length | type`` + payload, a record split
  over FIRST/MIDDLE/LAST chunks) whose payloads are W&B's own protobuf ``Record`` messages
  (``wandb.proto.wandb_internal_pb2``). Every chunk's checksum is verified.
* :func:`tensorboard_run` reads event files with TensorBoard's ``EventAccumulator`` (scalars, images, HParams).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_BLOCK, _CHUNK_HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every ``Record`` of an offline ``.wandb`` file, in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = Path(path).read_bytes()
    assert data[: len(_HEADER)] == _HEADER, f"{path}: not a W&B log (header {data[:7]!r})"
    pos, payloads, pending = len(_HEADER), [], b""
    while pos + _CHUNK_HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK_HEADER:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if (crc, length, kind) == (0, 0, 0):  # zero padding at the end of a block
            pos += room
            continue
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        assert crc == zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF, f"{path}: bad checksum at {pos}"
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            payloads.append(pending + chunk)
        else:
            raise AssertionError(f"{path}: unknown chunk type {kind} at {pos}")
    records = []
    for payload in payloads:
        record = Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def _items(items: Any) -> dict[str, Any]:
    """``{"a/b": value}`` of W&B's ``key``/``nested_key`` + ``value_json`` items."""
    return {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in items}


def wandb_run(path: Path) -> dict[str, Any]:
    """What a W&B dashboard shows of one offline run: its ``run`` records, merged ``config``, ``history`` rows,
    merged ``summary`` and whether it recorded an ``exit``."""
    out: dict[str, Any] = {"runs": [], "config": {}, "history": [], "summary": {}, "exit": False}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["runs"].append(record.run)
        elif kind == "config":
            out["config"].update(_items(record.config.update))
        elif kind == "history":
            out["history"].append(_items(record.history.item))
        elif kind == "summary":
            out["summary"].update(_items(record.summary.update))
        elif kind == "exit":
            out["exit"] = True
    return out


def tensorboard_run(folder: Path) -> dict[str, Any]:
    """What TensorBoard shows of the event files under ``folder``: ``{"scalars": {tag: [(step, value)]},
    "images": {tag: [(step, width, height)]}, "hparams": {name: value}, "files": n}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out: dict[str, Any] = {"scalars": {}, "images": {}, "hparams": {}, "files": 0}
    for events in sorted(Path(folder).rglob("events.out.tfevents.*")):
        out["files"] += 1
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags["scalars"]:
            out["scalars"].setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
        for tag in tags["images"]:
            out["images"].setdefault(tag, []).extend((e.step, e.width, e.height) for e in acc.Images(tag))
        try:
            content = acc.PluginTagToContent("hparams").get("_hparams_/session_start_info")
        except KeyError:  # no HParams in this file
            content = None
        if content is not None:
            info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
            for name, value in info.hparams.items():
                out["hparams"][name] = getattr(value, value.WhichOneof("kind"))
    return out
