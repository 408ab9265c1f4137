"""The round store: a short round's records stay in memory (nothing on disk) and read back as the disk
would give them; past ``hold_s`` or the byte budget everything held is written and later records go to
disk at once; ``hold_s = 0`` writes each record at once; another rank's held records are handed over in memory."""

import time

import torch

from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.storage.round_store import ClientRecord, RoundStore
from fl_lightning.federation.transport import Download, Upload


def _upload(value: float) -> Upload:
    return Upload({"w": torch.full((4,), value)}, {"num_samples": 3})


def _plan() -> RoundPlan:
    return RoundPlan({0: Download({"w": torch.zeros(4)}), 1: Download({"w": torch.zeros(4)})})


def test_a_short_round_holds_its_records_in_memory(tmp_path):
    store = RoundStore(tmp_path, 0, hold_s=3600)
    store.save_plan(_plan())
    live = _upload(1.0)
    store.save_client(1, ClientRecord(0.1, 16, 24), live)
    live.tensors["w"].add_(5.0)  # the client's model trains on: the held record is a snapshot
    assert store.held == 1 and store.has_client(1) and not store.has_client(0)
    assert not store.folder.exists()  # nothing written
    record, upload = store.load_client(1)
    assert record.bytes_up == 24 and torch.equal(upload.tensors["w"], torch.full((4,), 1.0))
    assert dict(store.uploads([1]))[1].meta == {"num_samples": 3}


def test_write_held_puts_the_plan_and_records_on_disk_and_later_ones_go_straight_there(tmp_path):
    store = RoundStore(tmp_path, 2, hold_s=3600)
    store.save_plan(_plan())
    store.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    store.write_held()
    store.save_client(1, ClientRecord(0.2, 16, 24), _upload(2.0))
    assert store.held == 0
    assert sorted(p.name for p in store.folder.iterdir()) == ["client000000.pt", "client000001.pt", "plan.pt"]
    reread = RoundStore(tmp_path, 2)  # what a resumed run sees
    assert reread.load_plan() is not None
    assert torch.equal(reread.load_client(1)[1].tensors["w"], torch.full((4,), 2.0))


def test_past_hold_s_or_the_byte_budget_the_store_writes(tmp_path):
    late = RoundStore(tmp_path, 0, hold_s=0.05)
    late.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    time.sleep(0.06)
    late.save_client(1, ClientRecord(0.1, 16, 24), _upload(2.0))
    assert late.held == 0 and len(list(late.folder.glob("client*.pt"))) == 2
    full = RoundStore(tmp_path, 1, hold_s=3600, hold_bytes=40)  # room for one 16-byte upload (+ its scalar)
    full.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    full.save_client(1, ClientRecord(0.1, 16, 24), _upload(2.0))
    assert full.held == 0 and len(list(full.folder.glob("client*.pt"))) == 2


def test_hold_s_zero_writes_every_record_at_once(tmp_path):
    store = RoundStore(tmp_path, 0)
    store.save_plan(_plan())
    store.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    assert store.held == 0 and (store.folder / "plan.pt").is_file() and store.has_client(0)
    store.clear()
    assert not store.folder.exists()


def test_another_ranks_held_records_are_handed_over_without_the_disk(tmp_path):
    server, other = RoundStore(tmp_path / "0", 4, hold_s=3600), RoundStore(tmp_path / "1", 4, hold_s=3600)
    server.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    other.save_client(3, ClientRecord(0.2, 16, 24), _upload(3.0))
    handed = other.held_records()  # what crosses the gather (the tensors, pickled by the backend)
    server.receive(handed)
    other.forget_held()
    assert other.held == 0 and server.held == 2 and not server.folder.exists() and not other.folder.exists()
    assert [c for c in server.uploads([3, 0])] == [0, 3]  # client order, whoever ran them
    assert torch.equal(server.load_client(3)[1].tensors["w"], torch.full((4,), 3.0))
    full = RoundStore(tmp_path / "2", 4, hold_s=3600, hold_bytes=40)  # past its budget the server writes them
    full.save_client(0, ClientRecord(0.1, 16, 24), _upload(1.0))
    full.receive(handed)
    assert full.held == 0 and sorted(p.name for p in full.folder.iterdir()) == ["client000000.pt", "client000003.pt"]
