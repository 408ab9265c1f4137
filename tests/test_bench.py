"""Tests for benchmarks/ (the top-level benchmarks): the measuring helpers, and one --quick run of every benchmark.

Timings are never compared with thresholds here (a shared CI machine cannot promise them); the
checks are that every figure is present and well formed, and that the numbers that do not depend
on the machine (byte counts, token counts, parameter counts, the framework computing the same R
as the bare loop) are exactly right.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from benchmarks import BENCHMARKS, format_value, results_table
from benchmarks.__main__ import main
from benchmarks._timing import SavedTensorBytes, Timing, figure, tensor_bytes, time_interleaved
from tests.conftest import REPO

FEDOPAL_FIGURES = {"statistics_throughput", "vpt_cost", "statistics_memory", "server_solve_ms", "server_solve_vs_clients"}
FEDISYN_FIGURES = {
    "generation_images_per_s",
    "generation_batched_speedup",
    "upload_vs_raw_sd15",
    "upload_vs_raw_tiny_vae",
    "round_overhead",
    "lora_step_vs_full",
    "lora_memory_vs_depth",
    "wfba_vs_equal",
    "clc_vs_capacity",
    "paper_consistency_worst",
    *(f"paper_{m}_time" for m in ("fedisyn", "caff", "sflf", "fgl", "gptfl")),
}


# -- helpers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("times", [(3.0,), (5.0, 1.0, 2.0), (4.0, 1.0, 3.0, 2.0), (1.0, 1.0, 9.0, 9.0, 2.0, 7.0)])
def test_timing_median_matches_numpy(times):
    assert Timing(times).median_s == pytest.approx(float(np.median(times)))


@pytest.mark.parametrize(
    ("value", "op", "bound", "meets"),
    [
        (0.96, ">=", 0.95, True),
        (0.94, ">=", 0.95, False),
        (1.08, "<=", 1.08, True),
        (1.09, "<=", 1.08, False),
    ],
)
def test_figure_records_whether_threshold_is_met(value, op, bound, meets):
    fig = figure(value, "x", op=op, bound=bound)
    assert fig["meets"] is meets and fig["threshold"] == {"op": op, "value": bound}
    assert figure(value, "ms")["meets"] is None and figure(value, "ms")["threshold"] is None
    with pytest.raises(ValueError):
        figure(value, "x", op=op)


def test_time_interleaved_runs_warmup_then_rotates_the_order():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    out = time_interleaved(fns, warmup=1, repeats=3, device=torch.device("cpu"))
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(t.times_s) == 3 and all(s >= 0 for s in t.times_s) for t in out.values())


def test_saved_tensor_bytes_counts_each_storage_once_and_skips_excluded():
    w = torch.randn(5, 7, requires_grad=True)  # a "parameter"
    x = torch.randn(4, 5, requires_grad=True)
    with SavedTensorBytes(exclude=[w]) as saved:
        y = x * x  # saves x twice: one storage
        z = (y @ w).sum()  # saves y (4x5) and w (excluded)
    z.backward()
    assert saved.bytes == 2 * 4 * 5 * 4  # x and y, float32


def test_tensor_bytes_counts_shared_storage_once():
    a = torch.zeros(10, 10, dtype=torch.float64)
    assert tensor_bytes([a, a[2:], a.T]) == 800
    assert tensor_bytes([a, torch.zeros(3, dtype=torch.float16)]) == 806


def test_cli_rejects_an_unknown_suite(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# -- one quick run of everything ----------------------------------------------------------------------
# One in-process `python -m benchmarks all --quick` shared by the tests below: ~35 s on two
# idle cores (two fresh processes for the memory probe pay the torch/open_clip import), hence slow.
@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "sub" / "quick.json"
    assert main(["all", "--quick", "--out", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_quick_json_has_every_figure_well_formed(quick_results):
    assert set(quick_results) == {"meta", *BENCHMARKS}
    assert quick_results["meta"]["quick"] is True and quick_results["meta"]["device"] in ("cpu", "cuda")
    assert set(quick_results["fedopal"]) == FEDOPAL_FIGURES | {"sizes"}
    assert set(quick_results["fedisyn"]) == FEDISYN_FIGURES | {"sizes"}
    for suite in BENCHMARKS:
        for name, fig in quick_results[suite].items():
            if name == "sizes":
                continue
            assert math.isfinite(fig["value"]) and fig["value"] > 0, (suite, name)
            assert isinstance(fig["unit"], str) and isinstance(fig["details"], dict)
            if fig["threshold"] is None:
                assert fig["meets"] is None
            else:
                op, bound = fig["threshold"]["op"], fig["threshold"]["value"]
                assert fig["meets"] == (fig["value"] <= bound if op == "<=" else fig["value"] >= bound)
            assert format_value(fig)
    assert results_table(quick_results).row_count == len(FEDOPAL_FIGURES) + len(FEDISYN_FIGURES)


@pytest.mark.slow
def test_quick_fedopal_numbers(quick_results):
    r = quick_results["fedopal"]
    thr = r["statistics_throughput"]["details"]
    assert thr["relative_difference_R"] < 1e-6  # the framework and the bare loop computed the same R
    assert thr["framework_images_per_s"] > 0 and thr["bare_images_per_s"] > 0
    assert r["statistics_throughput"]["value"] == pytest.approx(thr["bare"]["median_s"] / thr["framework"]["median_s"])
    vpt = r["vpt_cost"]["details"]
    assert (vpt["tokens_M0"], vpt["tokens_M10"]) == (197, 207)  # ViT-B/16's geometry even when tiny
    mem = r["statistics_memory"]["details"]
    assert mem["10x"]["collected"] == 10 * mem["1x"]["collected"] > 0
    assert 0.5 < r["statistics_memory"]["value"] < 5  # sane, not the ≤ 1.1 threshold
    per_k = r["server_solve_ms"]["details"]["per_num_clients"]
    assert set(per_k) == {"10", "100"} and all(v["solve_ms"] > 0 and v["sum_ms"] > 0 for v in per_k.values())


@pytest.mark.slow
def test_quick_fedisyn_numbers(quick_results):
    r = quick_results["fedisyn"]
    sizes = r["sizes"]
    D, Z = sizes["upload_images"], sizes["num_centroids"]
    scalars = 4 * 8  # label, count, timestep, Z' (number of centroids sent)
    for px in (224, 512):  # SD v1-5: VAE x8 into 4 float32 channels
        sd = r["upload_vs_raw_sd15"]["details"][f"{px}px"]
        assert sd["upload_bytes"] == (Z + 1) * 4 * (px // 8) ** 2 * 4 + scalars
        assert sd["raw_bytes"] == D * 3 * px * px
    tiny = r["upload_vs_raw_tiny_vae"]["details"]
    S = tiny["image_size"]  # tiny VAE: x2 into 4 float32 channels
    assert tiny["upload_bytes"] == (Z + 1) * 4 * (S // 2) ** 2 * 4 + scalars and tiny["raw_bytes"] == D * 3 * S * S

    gen = r["generation_images_per_s"]["details"]
    assert r["generation_images_per_s"]["value"] == pytest.approx(gen["batch_size"] / gen["batched"]["median_s"])

    over = r["round_overhead"]["details"]
    assert len(over["depths"]) == 10 and all(1 <= x <= 12 for x in over["depths"])
    assert over["steps_per_client"] == math.ceil(500 / sizes["step_batch"])
    assert r["round_overhead"]["value"] == pytest.approx(100 * (over["plan_s"] + over["aggregate_s"]) / over["client_compute_s"])

    per_depth = r["lora_memory_vs_depth"]["details"]["per_depth"]
    depths = sorted(per_depth, key=int)
    assert depths == ["1", "4", "12"]
    for shallow, deep in zip(depths, depths[1:]):  # training more blocks saves more and trains more
        assert per_depth[deep]["activations_bytes"] > per_depth[shallow]["activations_bytes"]
        assert per_depth[deep]["trainable_params"] > per_depth[shallow]["trainable_params"]
    for d in depths:  # float32 gradients, AdamW keeps two moments per trained parameter
        assert per_depth[d]["gradient_bytes"] == 4 * per_depth[d]["trainable_params"]
        assert per_depth[d]["optimizer_bytes"] >= 2 * per_depth[d]["gradient_bytes"]
    assert r["wfba_vs_equal"]["value"] == pytest.approx(
        r["wfba_vs_equal"]["details"]["per_dataset"]["cifar10"]["policies"]["clc"]["equal_over_wfba"]
    )
    assert r["clc_vs_capacity"]["details"]["depths_differ"]
    full = r["lora_memory_vs_depth"]["details"]["full_finetuning"]
    assert full["trainable_params"] > per_depth["12"]["trainable_params"]
    step = r["lora_step_vs_full"]["details"]
    assert step["full_trainable_params"] == full["trainable_params"]


# -- the FeDiSyn system model figures (pure arithmetic: fast, exact, same in quick and full runs) ---------
def test_fedisyn_system_model_figures_against_a_hand_computed_round():
    from benchmarks.fedisyn import _system_model
    from fl_lightning.systems.backbones import backbone
    from fl_lightning.systems.channel import ChannelConfig, device_spectral_efficiency
    from fl_lightning.systems.devices import board_profiles, paper_testbed, profile_arrays

    figures = _system_model()
    wfba = figures["wfba_vs_equal"]
    for dataset, model, D in (("cifar10", "vit_base_patch16_224", 5000.0), ("food101", "vit_large_patch16_224", 7575.0)):
        vit = backbone(model)
        tau = 32 * 6 * 8 * vit.embed_dim  # rank 8: qkv 8·(D+3D) + proj 8·(D+D) float32 params
        assert wfba["details"]["lora_bits_per_block"][dataset] == tau
        p = profile_arrays(paper_testbed(board_profiles(vit, 32)))
        _, e = device_spectral_efficiency(p["transmit_power_w"], config=ChannelConfig(), seed=0)
        for row in wfba["details"]["per_dataset"][dataset]["policies"].values():
            x = np.array(row["depths"], dtype=float)
            H = D * (p["forward_time_s"] + x * p["backward_time_per_layer_s"])
            S = tau * x
            # B/N by hand: the last device to finish computing and uploading at 1 MHz.
            assert row["equal"]["round_time_s"] == pytest.approx(float(np.max(H + S * 10 / (10e6 * e))), rel=1e-12)
            if "wfba" in row:  # every device finishes together, within the equal split's time
                bw = np.array(row["wfba"]["bandwidth_hz"])
                np.testing.assert_allclose(H + S / (bw * e), row["wfba"]["round_time_s"], rtol=1e-9)
                assert row["wfba"]["round_time_s"] <= row["equal"]["round_time_s"]
    assert wfba["value"] >= 1.0  # WFBA never loses to B/N
    clc = figures["clc_vs_capacity"]
    # CLC does not pick CAFF's depths, and it scores a higher utility U = Σ c / T than they do ...
    assert clc["details"]["clc"]["depths"] != clc["details"]["capacity"]["depths"] and clc["value"] > 1
    # ... and the calibration holds every method within the paper's reported time to 80 % (Food-101)
    worst = figures["paper_consistency_worst"]
    ratios = [figures[f"paper_{m}_time"]["value"] for m in ("fedisyn", "caff", "sflf", "fgl", "gptfl")]
    assert worst["value"] == pytest.approx(max(max(ratios), worst["details"]["lambda_ratio"])) and worst["meets"]
    assert all(figures[f"paper_{m}_time"]["meets"] for m in ("fedisyn", "caff", "sflf", "fgl", "gptfl"))


# -- the engine at scale (benchmarks/scale.py) ---------------------------------------------------
@pytest.mark.slow
def test_quick_scale_numbers(tmp_path):
    """``python -m benchmarks scale --quick --clients 10,40 --engine-only``: four fresh processes
    (framework and bare loop at K=10 and 40) plus a 2-process run at each K. Checks what does not depend on
    the machine: the framework and the bare loop compute the same classifier, the bytes written are the
    uploads' plus a small constant per record, 2 processes give the 1-process result and report both ranks."""
    from benchmarks.scale import SIZES

    out = tmp_path / "scale.json"
    assert main(["scale", "--quick", "--clients", "10,40", "--processes", "1,2", "--engine-only", "--out", str(out)]) == 0
    r = json.loads(out.read_text(encoding="utf-8"))["scale"]
    assert {
        "overhead_per_client_s",
        "overhead_vs_compute_pct",
        "checkpoint_bytes_linearity",
        "rss_rank0_ratio",
        "rss_rank0_ratio_2proc",
        "rss_other_ranks_ratio",
    } == set(r) - {"sizes"}
    d = SIZES[True]["dim"]
    upload = (d * (d + 1) // 2 + d * 10) * 8 + 8  # R's upper triangle + C (d x 10), float64, + N
    per_k = r["sizes"]["per_k"]
    assert sorted(map(int, per_k)) == [10, 40]
    for k, point in per_k.items():
        one, two = point["p1"], point["p2"]
        assert one["relative_difference_W"] < 1e-6  # the same statistics and solve as the bare loop
        assert one["accuracy"] == pytest.approx(one["bare_accuracy"], abs=1e-6)
        assert one["bytes_up"] == two["bytes_up"] == int(k) * upload
        assert one["round_folder_files"] == two["round_folder_files"] == int(k) + 1  # the plan + one per client
        assert int(k) * upload < one["round_folder_bytes"] <= one["bytes_written"]
        assert one["bytes_written"] < int(k) * (upload + 4096) + 64 * 1024  # O(upload) per client, not O(K)
        assert one["overhead_per_client_s"] == pytest.approx((one["wall_s"] - one["bare_s"]) / int(k))
        assert two["accuracy"] == one["accuracy"]
        assert len(two["peak_rss_rounds_bytes"]) == 2 and min(two["peak_rss_rounds_bytes"]) > 0
    assert r["checkpoint_bytes_linearity"]["value"] < 1.1


def test_scale_import_times_parse_importtime_output():
    from benchmarks.scale import _import_times

    text = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:      1000 |    1500000 |     torch",
            "import time:       200 |    2500000 |   lightning.fabric",
            "import time:       100 |    2600000 | lightning",
            "import time:        50 |      70000 | timm.layers",
            "import time:        10 |     900000 | timm",
        ]
    )
    assert _import_times(text) == {"lightning": 2.6, "lightning.fabric": 2.5, "torch": 1.5, "timm": 0.9}


# -- frozen features once per comparison (benchmarks/features.py) ---------------------------------
def test_features_suite_stops_with_one_line_without_the_checkpoint(tmp_path, monkeypatch, capsys):
    from benchmarks import features

    monkeypatch.setattr(features, "CHECKPOINT", tmp_path / "missing.safetensors")
    assert main(["features"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("benchmarks: ") and "missing.safetensors" in last and "--quick" in last


@pytest.mark.parametrize("num_clients", [20, 150])  # digits, Dirichlet; beyond 100: generated data in shards
def test_engine_bench_bare_loop_matches_the_framework_round_by_round(tmp_path, one_thread, num_clients):
    """``bench engine``'s two jobs (run here in process, 2 rounds, the tiny model): the bare loop and the
    framework give the same test accuracy in every round, and each reports one time per round."""
    import yaml

    from benchmarks.engine import _bare_worker, _framework_worker, engine_config
    from fl_lightning.config.loading import build_config

    values = engine_config(output_dir=str(tmp_path / "runs"), model="tiny", num_clients=num_clients, rounds=2)
    assert values["data"]["name"] == ("digits" if num_clients <= 100 else "synthetic")
    cfg = build_config(values)
    assert round(cfg.federation.client_fraction * cfg.partition.num_clients) == 10
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(values), encoding="utf-8")
    _bare_worker(config, tmp_path / "bare.json")
    _framework_worker(config, tmp_path / "framework.json")
    bare, fw = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("bare", "framework"))
    n = bare["test_size"]
    assert [round(a * n) for a in fw["accuracy"]] == [round(a * n) for a in bare["accuracy"]]
    assert len(fw["round_s"]) == len(bare["round_s"]) == len(fw["round_cpu_s"]) == 2


def test_engine_point_takes_each_sides_best_run_and_refuses_a_disagreement(tmp_path, monkeypatch):
    """``bench engine``'s figure from alternating fresh runs (the processes faked here): each side's best
    mean round, every run kept in the details, the start-up references timed after each framework run;
    a run whose accuracy differs from the bare loop's in any round is an error, not a figure."""
    from benchmarks import engine

    bare_means, fw_means = iter([0.30, 0.20, 0.25]), iter([0.33, 0.26, 0.24])
    accuracy = [0.5, 0.75]

    def fake_worker(kind, config, out, threads):
        mean = next(bare_means if kind == "bare" else fw_means)
        result = {
            "round_s": [mean, mean],
            "round_cpu_s": [mean, mean],
            "accuracy": accuracy,
            "test_size": 4,
            "first_client_epoch_s": 105.0,
            "first_client_cpu_s": 4.0,
            "report_s": 0.1,
        }
        return result, 9.0, 100.0

    monkeypatch.setattr(engine, "_worker", fake_worker)
    monkeypatch.setattr(engine, "_imports_done", lambda code, threads: (4.0, 3.9))
    fig, details = engine._point(
        tmp_path, "job", 1, 3, time_imports=True, concurrent=False, model="tiny", num_clients=20, rounds=2
    )
    assert fig["value"] == pytest.approx(0.24 / 0.20) and fig["meets"] is False
    assert details["framework_mean_round_s_runs"] == pytest.approx([0.33, 0.26, 0.24])
    assert details["first_client_s"] == pytest.approx(5.0)
    start = engine._start_figures(details)
    assert start["start_ratio"]["value"] == pytest.approx(5.0 / 4.0)
    assert len(start["start_ratio"]["details"]["imports_runs"]) == 3

    bare_means, fw_means = iter([0.3]), iter([0.3])
    accuracy_iter = iter([[0.5, 0.75], [0.5, 0.5]])

    def disagreeing(kind, config, out, threads):
        result, wall, spawned = fake_worker(kind, config, out, threads)
        return {**result, "accuracy": next(accuracy_iter)}, wall, spawned

    monkeypatch.setattr(engine, "_worker", disagreeing)
    with pytest.raises(RuntimeError, match="disagree on the test accuracy of rounds \\[1\\]"):
        engine._point(tmp_path / "again", "job", 1, 1, concurrent=False, model="tiny", num_clients=20, rounds=2)

    # one thread on two cores: the pair runs at once; start-up is then timed alone (the "start" worker)
    pairs = iter([0.30, 0.36, 0.28, 0.30])

    def fake_pair(config, folder, r):
        bare, fw = next(pairs), next(pairs)
        one = {"accuracy": accuracy, "test_size": 4, "report_s": 0.1}
        return ({**one, "round_s": [bare], "round_cpu_s": [bare]}, 9.0), ({**one, "round_s": [fw], "round_cpu_s": [fw]}, 9.0)

    kinds = []

    def fake_start(kind, config, out, threads):
        kinds.append(kind)
        return {"first_client_epoch_s": 106.0, "first_client_cpu_s": 5.5}, 7.0, 100.0

    monkeypatch.setattr(engine, "_cores", lambda: [0, 1])
    monkeypatch.setattr(engine, "_pair_at_once", fake_pair)
    monkeypatch.setattr(engine, "_worker", fake_start)
    fig, details = engine._point(tmp_path / "pairs", "job", 1, 2, time_imports=True, model="tiny", num_clients=20, rounds=1)
    assert details["concurrent"] and kinds == ["start", "start"] and details["first_client_s"] == pytest.approx(6.0)
    assert fig["value"] == pytest.approx(0.30 / 0.28)


def test_the_former_command_prints_the_new_one():
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning.bench", "engine", "--threads", "1,2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and "python -m benchmarks engine --threads 1,2" in proc.stderr, proc.stderr


@pytest.mark.slow  # a tiny FedAvg on 1 and 2 gloo processes (~40 s on 2 cores)
def test_ranks_suite_reports_each_ranks_waits_by_phase(tmp_path):
    from benchmarks import ranks

    out = ranks.run(quick=True, methods=["fedavg"], processes=[1, 2, 4], work_dir=tmp_path)
    assert out["sizes"]["processes"] == [1, 2]  # quick: 1 and 2 only
    one, two = out["sizes"]["points"]["fedavg_p1"], out["sizes"]["points"]["fedavg_p2"]
    assert one["waits"] == [{}] and one["wait_share_max"] == 0.0  # one process: no collective at all
    assert len(two["waits"]) == 2 and 0.0 <= two["wait_share_max"] <= 1.0
    assert "the test split's evaluation" in two["waits"][1]  # every rank evaluates its shard of the test split
    fig = out["fedavg_p2_wait_share_max"]
    assert fig["unit"] == "%" and fig["threshold"] == {"op": "<=", "value": 20.0}
    assert not list(tmp_path.iterdir())  # the runs are removed


def test_loader_suite_reports_the_data_path_against_the_step(capsys):
    """The data-path suite: images/s per kind, path and worker count, the required rates by arithmetic (exact:
    989 TFLOP/s x 40 % over 3 x 17.6 / 61.6 GFLOP), and the workers that makes."""
    from benchmarks import loader

    out = loader.run(quick=True, workers=(0,), images=8)
    assert out["required_vit_b16_images_per_s"]["value"] == pytest.approx(989e12 * 0.4 / (3 * 17.6e9))
    assert out["required_vit_l16_images_per_s"]["value"] == pytest.approx(989e12 * 0.4 / (3 * 61.6e9))
    for kind in ("cifar", "food101"):
        for path in ("float32", "uint8"):
            rate = out[f"{kind}_{path}_workers0_images_per_s"]["value"]
            assert math.isfinite(rate) and rate > 0
            for vit in ("vit_b16", "vit_l16"):
                need = out[f"required_{vit}_images_per_s"]["value"]
                assert out[f"{kind}_{path}_workers_for_{vit}"]["value"] == math.ceil(need / rate)
    assert "fedopal_cifar10.yaml" in out["sizes"]["configs"]["cifar"]
    assert out["sizes"]["bytes_per_image"] == {"float32": 602112, "uint8": 150528}
    for path in ("png_train", "png_val", "store_exact_train", "store_val", "store_input_train", "store_build"):
        assert out[f"synthetic_{path}_images_per_s"]["value"] > 0  # FeDiSyn's 512-px PNGs vs the synthetic store
