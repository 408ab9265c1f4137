import math

import pytest
import torch

from fl_lightning.federation.storage.checkpoint import atomic_save, safe_load
from fl_lightning.federation.transport import SCALAR_BYTES, Upload, UploadRejected, check_upload


def test_bytes_are_exact():
    up = Upload({"a": torch.zeros(3, 4, dtype=torch.float64), "b": torch.zeros(5, dtype=torch.float16)}, {"n": 7})
    assert up.num_bytes == 3 * 4 * 8 + 5 * 2 + SCALAR_BYTES


def test_rejects_wrong_shape_missing_and_nonfinite():
    good = Upload({"w": torch.ones(2, 2)}, {"n": 1})
    check_upload(good, {"w": (2, 2)})
    with pytest.raises(UploadRejected, match="shape"):
        check_upload(good, {"w": (2, 3)})
    with pytest.raises(UploadRejected, match="missing"):
        check_upload(good, {"v": (2, 2)})
    for bad in (math.nan, math.inf, -math.inf):  # anywhere, in any float dtype
        for dtype in (torch.float16, torch.float32, torch.float64):
            w = torch.ones(7, 5, dtype=dtype)
            w[3, 2] = bad
            with pytest.raises(UploadRejected, match="non-finite"):
                check_upload(Upload({"w": w}))
    check_upload(Upload({"empty": torch.zeros(0), "ints": torch.arange(3)}))
    with pytest.raises(UploadRejected, match="not finite"):
        check_upload(Upload({}, {"loss": math.inf}))


def test_checkpoint_round_trip_is_weights_only(tmp_path):
    up = Upload({"w": torch.randn(3)}, {"n": 2})
    atomic_save({"uploads": {4: up.state_dict()}, "round": 1}, tmp_path / "c.pt")
    back = safe_load(tmp_path / "c.pt")
    assert back["round"] == 1 and torch.equal(Upload.from_state_dict(back["uploads"][4]).tensors["w"], up.tensors["w"])
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


def test_safe_load_refuses_arbitrary_objects(tmp_path):
    import fractions

    torch.save({"x": fractions.Fraction(1, 3)}, tmp_path / "evil.pt")  # any non-tensor class
    with pytest.raises(Exception):
        safe_load(tmp_path / "evil.pt")
