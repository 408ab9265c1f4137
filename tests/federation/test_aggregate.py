"""Tests for fl_lightning.federation.aggregate: FedAvg and FeDiSyn's layer-wise LoRA averaging."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.federation.aggregate import WeightedMean, layerwise_average, weighted_average


def layer_of(key: str) -> int:
    return int(key.split(".")[1])  # "blocks.<l>.<name>"


def test_weighted_average_hand_computed():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([4.0, -2.0])
    # (1*a + 3*b) / 4 = [13/4, -4/4]
    torch.testing.assert_close(weighted_average([a, b], [1, 3]), torch.tensor([3.25, -1.0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_weighted_average_matches_numpy_and_keeps_dtype(dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(3, 5)) for _ in range(4)]
    weights = rng.uniform(0.1, 10.0, size=4)
    out = weighted_average([torch.tensor(a, dtype=dtype) for a in arrays], weights.tolist())
    assert out.dtype == dtype
    inputs = np.stack([torch.tensor(a, dtype=dtype).double().numpy() for a in arrays])
    expected = np.average(inputs, axis=0, weights=weights)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=tol, atol=tol)


def test_weighted_average_is_accurate_for_many_small_weights():
    # 10_000 float32 copies of 0.1: float32 accumulation drifts, float64 does not.
    tensors = [torch.full((1,), 0.1, dtype=torch.float32)] * 10_000
    out = weighted_average(tensors, [1.0] * 10_000)
    assert out.item() == torch.tensor(0.1, dtype=torch.float32).item()


@pytest.mark.parametrize(
    ("tensors", "weights", "message"),
    [
        ([], [], "no tensors"),
        ([torch.zeros(2)], [1, 2], "weight"),
        ([torch.zeros(2), torch.zeros(2)], [1, -1], ">= 0"),
        ([torch.zeros(2), torch.zeros(2)], [0, 0], "positive sum"),
        ([torch.zeros(2), torch.zeros(2)], [1, float("nan")], ">= 0"),
        ([torch.zeros(2), torch.zeros(3)], [1, 1], "shapes"),
    ],
)
def test_weighted_average_rejects_bad_input(tensors, weights, message):
    with pytest.raises(ValueError, match=message):
        weighted_average(tensors, weights)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int64, torch.int32, torch.bool])
def test_weighted_mean_fold_matches_numpy_float64(dtype):
    # streamed, one upload at a time, against np.average in float64; integers rounded to nearest, not truncated
    rng = np.random.default_rng(3)
    raw = [rng.normal(scale=5.0, size=(4, 3)) for _ in range(5)]
    if dtype == torch.bool:
        raw = [a > 0 for a in raw]
    tensors = [torch.tensor(a).to(dtype) for a in raw]
    weights = rng.integers(1, 40, size=5).astype(float)
    fold = WeightedMean()
    for t, w in zip(tensors, weights):
        fold.add({"x": t, "n": torch.tensor(7, dtype=torch.int64)}, w)
    out = fold.result()
    assert out["x"].dtype == dtype and out["n"].dtype == torch.int64
    expected = np.average(np.stack([t.double().numpy() for t in tensors]), axis=0, weights=weights)
    if dtype.is_floating_point:
        tol = 2e-3 if dtype == torch.float16 else 1e-6
        np.testing.assert_allclose(out["x"].double().numpy(), expected, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out["x"].double().numpy(), np.round(expected).astype(np.float64))
    assert int(out["n"]) == 7
    assert fold.total_weight == float(weights.sum())


def test_weighted_mean_fold_is_bit_identical_to_the_plain_float64_idiom():
    # the fold's reused scratch buffer (keys of >= 16,384 elements) must give exactly `acc += t.to(float64) * w`
    # (the bench's bare loop), for keys of different sizes (the buffer is shared and grown) and a
    # non-contiguous input
    gen = torch.Generator().manual_seed(0)
    shapes = {"small": (3,), "big": (130, 131), "mid": (5, 7, 2), "bigger": (150, 150), "count": ()}
    uploads = [
        {
            k: (
                torch.randint(0, 50, s, generator=gen)
                if k == "count"
                else torch.randn(s, generator=gen, dtype=torch.float32) * 10
            )
            for k, s in shapes.items()
        }
        for _ in range(6)
    ]
    uploads[2]["big"] = torch.randn(131, 130, generator=gen).t()  # a transposed view
    weights = [17.0, 3.0, 0.1, 250.0, 1.0, 9.5]
    fold, expected = WeightedMean(), {}
    for up, w in zip(uploads, weights):
        fold.add(up, w)
        for k, t in up.items():
            term = t.to(torch.float64) * w
            expected[k] = term if k not in expected else expected[k] + term
    total = sum(weights)
    for k, out in fold.result().items():
        mean = expected[k] / total
        want = (mean.round() if k == "count" else mean).to(uploads[0][k].dtype)
        assert torch.equal(out, want), k


def test_weighted_mean_rounds_integer_buffers_instead_of_truncating():
    fold = WeightedMean()
    fold.add({"num_batches_tracked": torch.tensor(2)}, 1.0)
    fold.add({"num_batches_tracked": torch.tensor(3)}, 3.0)  # (2 + 9) / 4 = 2.75 -> 3, not 2
    assert fold.result()["num_batches_tracked"] == torch.tensor(3)


def test_weighted_mean_weights_each_key_over_the_uploads_that_hold_it():
    fold = WeightedMean()
    fold.add({"a": torch.tensor([1.0]), "b": torch.tensor([10.0])}, 1.0)
    fold.add({"a": torch.tensor([5.0])}, 3.0)  # "b" only from the first upload
    out = fold.result()
    torch.testing.assert_close(out["a"], torch.tensor([4.0]))
    torch.testing.assert_close(out["b"], torch.tensor([10.0]))


@pytest.mark.parametrize(("weight", "message"), [(-1.0, ">= 0"), (float("nan"), ">= 0"), (float("inf"), "finite")])
def test_weighted_mean_rejects_bad_weights(weight, message):
    with pytest.raises(ValueError, match=message):
        WeightedMean().add({"a": torch.zeros(1)}, weight)


def test_weighted_mean_rejects_zero_total_and_shape_mismatch():
    fold = WeightedMean()
    fold.add({"a": torch.zeros(2)}, 0.0)
    with pytest.raises(ValueError, match="weight 0"):
        fold.result()
    with pytest.raises(ValueError, match="shapes"):
        fold.add({"a": torch.zeros(3)}, 1.0)


def test_layerwise_average_hand_computed():
    # 3 blocks; device 0 (n=1) trained blocks 1,2; device 1 (n=3) trained block 2 only.
    g = {f"blocks.{l}.{p}": torch.full((2,), 100.0 + l) for l in range(3) for p in ("A", "B")}
    c0 = {k: torch.full((2,), 1.0) for k in g if layer_of(k) in (1, 2)}
    c1 = {k: torch.full((2,), 5.0) for k in g if layer_of(k) == 2}
    out = layerwise_average(g, [c0, c1], [1, 3], layer_of=layer_of)
    assert set(out) == set(g)
    for p in ("A", "B"):
        torch.testing.assert_close(out[f"blocks.0.{p}"], torch.full((2,), 100.0))  # nobody trained it
        torch.testing.assert_close(out[f"blocks.1.{p}"], torch.full((2,), 1.0))  # only device 0
        torch.testing.assert_close(out[f"blocks.2.{p}"], torch.full((2,), 4.0))  # (1*1 + 3*5) / 4
    assert out["blocks.0.A"] is not g["blocks.0.A"]  # a new state, not an alias


def test_layerwise_average_matches_brute_force():
    rng = np.random.default_rng(1)
    num_layers, num_clients = 6, 5
    g = {f"blocks.{l}.{p}": torch.tensor(rng.normal(size=(2, 3))) for l in range(num_layers) for p in ("A", "B")}
    depths = rng.integers(0, num_layers + 1, size=num_clients)  # x_i, including 0 and L
    n = rng.integers(1, 50, size=num_clients).astype(float)
    clients = [{k: torch.tensor(rng.normal(size=(2, 3))) for k in g if layer_of(k) >= num_layers - x} for x in depths]
    out = layerwise_average(g, clients, n.tolist(), layer_of=layer_of)
    for key, value in g.items():
        l = layer_of(key)
        # Iverson indicator 1[l >= L - x_i] (0-indexed blocks), written out element by element.
        num = np.zeros((2, 3))
        den = 0.0
        for i in range(num_clients):
            if l >= num_layers - depths[i]:
                num += n[i] * clients[i][key].numpy()
                den += n[i]
        expected = value.numpy() if den == 0 else num / den
        np.testing.assert_allclose(out[key].numpy(), expected, rtol=1e-12, atol=1e-12)


def test_layerwise_average_rejects_partial_layer_and_unknown_key():
    g = {"blocks.0.A": torch.zeros(1), "blocks.0.B": torch.zeros(1)}
    with pytest.raises(ValueError, match="only in part"):
        layerwise_average(g, [{"blocks.0.A": torch.ones(1)}], [1], layer_of=layer_of)
    with pytest.raises(ValueError, match="lacks"):
        layerwise_average(g, [{"blocks.9.A": torch.ones(1)}], [1], layer_of=layer_of)
    with pytest.raises(ValueError, match="weight"):
        layerwise_average(g, [dict(g)], [1, 2], layer_of=layer_of)
    with pytest.raises(ValueError, match="weight 0"):
        layerwise_average(g, [dict(g)], [0], layer_of=layer_of)


def test_layerwise_average_with_no_clients_keeps_global():
    g = {"blocks.0.A": torch.arange(3.0)}
    torch.testing.assert_close(layerwise_average(g, [], [], layer_of=layer_of), g)
