"""scalestudy-predict: the collective formulas against hand-computed times, recovery of
known parameters from noisy data the model made itself, the held-out check on the
committed example sweep, the prediction ledger and the command line's bad input."""
import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.results import load

from scalestudy_analysis.results import metrics
from scalestudy_analysis.predict.cli import LEDGER_NAME, main
from scalestudy_analysis.predict.nccl_tuning import NCCL_2_23, flat_tuning
from scalestudy_analysis.predict.comm import (CommParams, bus_factor, collective_time,
                                              ring_time, tree_time)
from scalestudy_analysis.predict.comm_fit import fit_comm
from scalestudy_analysis.predict.fit import RunSummary, fit_model, held_out, summarize_run
from scalestudy_analysis.predict.model import (MemoryModel, Network, StepModel, predict_point,
                                               read_network)
from synth import write_run
from test_bench import write_bench

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt2-small-strong-4xh200"
NETWORKS = ROOT / "experiments" / "networks"
US = 1e-6
# Eight GPUs a node: 3.4 µs a step inside, 9.6 µs across, 8.4 µs a call (latencies given
# outright, Simple only: tests/test_nccl_tuning.py covers NCCL's tables), 450 GB/s bus
# inside a node and 50 GB/s per GPU across (8 × 50 = 400 GB/s for a node's rings).
FLAT = flat_tuning(8.4, 3.4, 9.6, "test")
PARAMS = CommParams(tuning=FLAT, intra_bus_bytes_per_s=450e9, node_bus_bytes_per_s=450e9,
                    inter_bytes_per_s=50e9, gpus_per_node=8)


# Hand-computed: (kind, bytes, N, seconds).
#  allreduce ring, 4 GPUs in one node: 8.4 + 6·3.4 µs + 2·3/4·1e9 B / 450e9 B/s.
#  allreduce ring, 16 GPUs on 2 nodes: 8.4 + 28·3.4 + 2·9.6 µs + 2·15/16·1e9 / 400e9.
#  reduce-scatter ring, 16 GPUs: 8.4 + 14·3.4 + 1·9.6 µs + 15/16·1e9 / 400e9.
#  allgather ring, 2 GPUs: 8.4 + 1·3.4 µs + 1/2·1e6 / 450e9.
RING_CASES = [("allreduce", 1e9, 4, 28.8 * US + 1.5e9 / 450e9),
              ("allreduce", 1e9, 16, 122.8 * US + 1.875e9 / 400e9),
              ("reduce_scatter", 1e9, 16, 65.6 * US + 0.9375e9 / 400e9),
              ("allgather", 1e6, 2, 11.8 * US + 0.5e6 / 450e9)]


@pytest.mark.parametrize("kind, payload, world_size, expected", RING_CASES)
def test_ring_time_matches_the_hand_computed_case(kind, payload, world_size, expected):
    # Float rounding only: the formula is closed-form.
    assert ring_time(kind, payload, world_size, PARAMS) == pytest.approx(expected, rel=1e-12)


def test_tree_time_matches_the_hand_computed_case():
    # 16 GPUs, 2 nodes of 8: 8.4 + 2·(7·3.4 + log2(2)·9.6) µs; 1e9 B at 0.5·0.9·400e9 B/s.
    assert tree_time(1e9, 16, PARAMS) == pytest.approx(75.2 * US + 1e9 / 180e9, rel=1e-12)
    # 4096 GPUs, 512 nodes: 9 levels, 8.4 + 2·(23.8 + 86.4) µs.
    assert tree_time(0.0, 4096, PARAMS) == pytest.approx(228.8 * US, rel=1e-12)


def test_nccl_choice_takes_the_ring_for_large_and_the_tree_for_small_messages():
    assert collective_time("allreduce", 1e9, 16, PARAMS)[1] == "ring/Simple"
    # A kilobyte over 4096 GPUs: the ring's 8190 steps cost 34 ms, the tree's 0.23 ms.
    seconds, algorithm = collective_time("allreduce", 1e3, 4096, PARAMS)
    assert algorithm == "tree/Simple" and seconds < 0.3e-3
    ring = ring_time("allreduce", 1e3, 4096, PARAMS)
    assert ring == pytest.approx((8.4 + 7168 * 3.4 + 1022 * 9.6) * US
                                 + 2 * 4095 / 4096 * 1e3 / 400e9)
    # reduce-scatter has no tree in NCCL, whatever the size.
    assert collective_time("reduce_scatter", 1e3, 4096, PARAMS)[1] == "ring/Simple"
    assert collective_time("allreduce", 1e9, 1, PARAMS) == (0.0, "ring/Simple")


def test_every_network_file_reads_and_names_its_source():
    files = sorted(NETWORKS.glob("*.ini"))
    assert {path.stem for path in files} >= {"ib-ndr-400", "roce-200", "socket-emulated"}
    for path in files:
        network = read_network(path)
        assert network.source and network.gpus_per_node >= 1
        # Latencies are NCCL's, by version; the GPU is named for the flags.
        assert network.latencies_us is None and network.gpu_model
        assert math.isfinite(network.gpu_memory_bytes)
    ndr = read_network(NETWORKS / "ib-ndr-400.ini")
    assert ndr.intra_bandwidth_bytes_per_s == 450e9 and ndr.inter_bandwidth_bytes_per_s == 50e9


TRUE = StepModel(label="truth", sharded=True, seq=1024, grad_accum=1, compute_scale_s=3.5e-3,
                 compute_exponent=0.94, jitter_cv=0.005, optimizer_fixed_s=2e-4,
                 optimizer_per_model_s=1.9e-3, other_s=2e-4,
                 collectives=[("reduce_scatter", 52428800)] * 10 + [("allgather", 52428800)] * 10,
                 hidden_share=0.7, window_share=1.0,
                 comm=CommParams(tuning=FLAT, intra_bus_bytes_per_s=200e9,
                                 node_bus_bytes_per_s=450e9, inter_bytes_per_s=50e9,
                                 gpus_per_node=8, base_extra_s=6.6e-6),
                 memory=MemoryModel(fixed={"parameters": 7e8}, per_shard={"optimizer": 1.4e9},
                                    per_sequence={"activations": 6e8}))
NOISE = 0.01   # 1 % multiplicative noise on every measured quantity


def _synthetic_summaries(rng):
    """Three repeats at N = 1, 2, 4, 8 of a strong sweep with global batch 64, every
    quantity the true model's with 1 % noise."""
    noisy = lambda value: value * (1.0 + NOISE * rng.standard_normal())  # noqa: E731
    summaries = []
    for size in (1, 2, 4, 8):
        batch = 64 / size
        point = predict_point(TRUE, size, batch)
        for _ in range(3):
            rows = [{"N": size, "kind": kind, "payload_bytes": payload,
                     "seconds": noisy(ring_time(kind, payload, size, TRUE.comm))}
                    for kind, payload in TRUE.collectives + [("reduce_scatter", 1 << 20)]
                    ] if size > 1 else []
            comm = point["comm_s"]
            summaries.append(RunSummary(
                world_size=size, ranks_per_node=size, nodes=1, micro_batch=batch,
                grad_accum=1, seq=1024,
                compute_s=noisy(point["compute_s"]),
                jitter_cv=noisy(TRUE.jitter_cv) if size > 1 else math.nan,
                step_jitter_cv=noisy(TRUE.jitter_cv), optimizer_s=noisy(point["optimizer_s"]),
                other_s=noisy(TRUE.other_s), comm_s=comm,
                exposed_s=comm * (1 - TRUE.hidden_share) * (1 + NOISE * rng.standard_normal()),
                window_share=1.0, step_s=noisy(point["step_time_s"]),
                collectives=TRUE.collectives, durations=pd.DataFrame(rows),
                memory=TRUE.memory.bytes_at(size, batch)))
    return summaries


def test_fit_recovers_known_parameters_from_noisy_model_data():
    network = Network("test", 8, 450e9, 50e9, latencies_us=(8.4, 3.4, 9.6))
    fitted = fit_model("fit", True, _synthetic_summaries(np.random.default_rng(7)), network)
    # 12 runs at 1 % noise: a fitted rate or share moves by a few tenths of a percent,
    # so 3 % (and 0.03 on the exponent, 0.02 on the hidden share) fails only on a wrong fit.
    # k and p of t_c(b) = k·b^p trade against each other; t_c at the ends of the measured
    # micro-batches (8 and 64) has a standard error of 0.5 % from 12 points, so 2 % is 4σ.
    assert fitted.compute_exponent == pytest.approx(TRUE.compute_exponent, abs=0.03)
    for batch in (8, 64):
        assert fitted.compute_s(batch) == pytest.approx(TRUE.compute_s(batch), rel=0.02)
    assert fitted.jitter_cv == pytest.approx(TRUE.jitter_cv, rel=0.03)
    assert fitted.optimizer_per_model_s == pytest.approx(TRUE.optimizer_per_model_s, rel=0.03)
    assert fitted.comm.intra_bus_bytes_per_s == pytest.approx(200e9, rel=0.03)
    assert fitted.hidden_share == pytest.approx(TRUE.hidden_share, abs=0.02)
    memory = fitted.memory.bytes_at(64, 1)
    for kind, value in TRUE.memory.bytes_at(64, 1).items():
        assert memory[kind] == pytest.approx(value, rel=0.03, abs=1e6)
    # What the fit is for: far outside the sweep, the step of the fitted model is the
    # true one's within 2 %.
    for size in (64, 512):
        truth = predict_point(TRUE, size, 8)["step_time_s"]
        assert predict_point(fitted, size, 8)["step_time_s"] == pytest.approx(truth, rel=0.02)


@pytest.fixture(scope="module")
def example_series():
    runs, _, _ = load.load_results(EXAMPLE)
    series, _ = metrics.group_series(runs)
    return series


def test_held_out_check_on_the_example_sweep(example_series):
    """Fit 1 and 2 GPUs, predict 4. The issue's goal is 5 %: the model's terms are each
    measured at N = 2, and what moves at 4 GPUs (compute at a micro-batch of 8, which was
    never fitted, and the collectives' bandwidth) stays within it on this sweep. The
    errors on this sweep are +2.2 % (ddp) and -1.1 % (zero2)."""
    network = read_network(NETWORKS / "ib-ndr-400.ini")
    errors = {}
    for series in example_series:
        summaries = [summarize_run(run) for run in series.runs]
        check = held_out(series.strategy_label, series.fields["strategy"] == "zero2",
                         summaries, network)
        assert check["fit_N"] == [1, 2] and check["predicted_N"] == 4
        errors[series.strategy_label] = check["signed_error"]
    assert set(errors) == {"ddp+overlap", "zero2+overlap"}
    for label, error in errors.items():
        assert abs(error) < 0.05, f"{label}: {100 * error:+.2f} %"


def _transfer(source, pattern, destination, how):
    """Copies or moves the result files matching pattern, keeping their folders."""
    for path in source.rglob(pattern):
        target = destination / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        how(path, target)


def test_ledger_keeps_predictions_and_scores_them_when_their_n_is_measured(tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(EXAMPLE, sweep)
    held = tmp_path / "held"
    _transfer(sweep, "n4-*.h5", held, shutil.move)
    network = str(NETWORKS / "ib-ndr-400.ini")
    first = tmp_path / "first"
    assert main([str(sweep), "--network", network, "--resamples", "20",
                 "--out", str(first)]) == 0
    # Beside the output, never in the sweep's folder.
    assert not (sweep / LEDGER_NAME).exists()
    ledger_path = first / LEDGER_NAME
    ledger = json.loads(ledger_path.read_text())
    open_n4 = [e for e in ledger["entries"] if e["N"] == 4]
    assert len(open_n4) == 2 and all(e["score"] is None and e["fit_N"] == [1, 2]
                                     for e in open_n4)
    assert all(e["nccl_version"] == "2.28.3" and e["ranks_per_node"] == 4
               and e["workload"]["model"] == "gpt2-small" for e in open_n4)
    shutil.copytree(held, sweep, dirs_exist_ok=True)
    out = tmp_path / "second"
    assert main([str(sweep), "--network", network, "--resamples", "20", "--out", str(out),
                 "--ledger", str(ledger_path)]) == 0
    ledger = json.loads(ledger_path.read_text())
    scored = [e for e in ledger["entries"] if e["N"] == 4 and e["fit_N"] == [1, 2]]
    assert len(scored) == 2 and all(e["score"] is not None for e in scored)
    for entry in scored:
        # The ledger's prediction is the held-out check's: the same fit, the same point.
        assert abs(entry["score"]["signed_error"]) < 0.05
    # The first run's predictions stay; the second adds those of its own fit (8, 16).
    assert {e["N"] for e in ledger["entries"]} == {4, 8, 16}
    summary = (out / "prediction.md").read_text()
    for section in ("## Held-out check", "## What would it take", "## Prediction ledger",
                    "2 predictions scored"):
        assert section in summary
    # The scored entries join the model's residuals.
    document = json.loads((out / "predictions.json").read_text())
    assert sum(r["source"] == "ledger" for r in document["model_error"]["residuals"]) == 2
    predictions = pd.read_csv(out / "predictions.csv")
    weak = predictions[predictions["scaling"] == "weak"]
    assert set(weak["N"]) >= {8, 64, 512, 4096}
    assert (predictions["step_time_s_lo"] <= predictions["step_time_s"] + 1e-12).all()
    assert (predictions["step_time_s"] <= predictions["step_time_s_hi"] + 1e-12).all()
    strong = predictions[predictions["scaling"] == "strong"]
    assert strong["N"].max() == 32       # global batch 32: one sequence per GPU at 32
    assert (out / "prediction.png").stat().st_size > 0
    assert len(pd.read_csv(out / "what-it-takes.csv")) == 2 * 3


def test_a_prediction_for_one_network_is_not_scored_by_a_run_on_another(tmp_path):
    """Predictions for N = 4 on the socket-emulated link (one GPU a node) are not scored by
    the example's N = 4, four H200s of one NVLink node, even when the scoring run names the
    socket-emulated file: the run's ranks per node are not that network's packing of N.
    (The first ledger test scores the same point for NDR-400 nodes of eight.)"""
    sweep = tmp_path / "sweep"
    _transfer(EXAMPLE / "strong" / "ddp-overlap_on", "n[12]-*.h5", sweep, shutil.copy)
    socket = str(NETWORKS / "socket-emulated.ini")
    ledger = tmp_path / "ledger.json"
    base = [str(sweep), "--network", socket, "--resamples", "20", "--ledger", str(ledger),
            "--out", str(tmp_path / "out")]
    assert main(base) == 0
    entries = json.loads(ledger.read_text())["entries"]
    open_n4 = [e for e in entries if e["N"] == 4]
    assert len(open_n4) == 1 and open_n4[0]["ranks_per_node"] == 1
    assert open_n4[0]["network"] == read_network(socket).name
    _transfer(EXAMPLE / "strong" / "ddp-overlap_on", "n4-*.h5", sweep, shutil.copy)
    assert main(base) == 0
    entries = json.loads(ledger.read_text())["entries"]
    assert [e["score"] for e in entries if e["N"] == 4 and e["fit_N"] == [1, 2]] == [None]


@pytest.mark.parametrize("arguments, named", [
    (["--network", "missing.ini"], "--network"),
    (["--network", str(NETWORKS / "ib-ndr-400.ini"), "--resamples", "5"], "--resamples"),
    (["--network", str(NETWORKS / "ib-ndr-400.ini"), "--weak-batch", "0"], "--weak-batch"),
    (["--network", str(NETWORKS / "ib-ndr-400.ini"), "--bench-comm", "missing.h5"],
     "--bench-comm"),
    (["--network", str(ROOT / "README.md")], "--network"),
])
def test_bad_input_exits_2_naming_the_option(arguments, named, capsys):
    assert main([str(EXAMPLE), "--no-ledger"] + arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("scalestudy-predict: error:") and named in error
    assert error.count("\n") == 1


def _bench_comm(path, base_s, bus_bytes_per_s, world_size=4):
    """A bench comm file whose times follow α₀ + steps·3.4 µs + factor·S/B exactly."""
    columns = {key: [] for key in ("collective", "bytes", "elems", "time_median_s",
                                   "algbw_gb_per_s", "bus_factor", "busbw_gb_per_s",
                                   "wrong_elems")}
    for kind in ("allreduce", "reduce_scatter", "allgather"):
        for payload in (1 << 12, 1 << 20, 1 << 26):
            steps = 2 * (world_size - 1) if kind == "allreduce" else world_size - 1
            factor = bus_factor(kind, world_size)
            seconds = base_s + steps * 3.4e-6 + factor * payload / bus_bytes_per_s
            algbw = payload / seconds / 1e9
            for key, value in (("collective", kind), ("bytes", payload), ("elems", payload // 4),
                               ("time_median_s", seconds), ("algbw_gb_per_s", algbw),
                               ("bus_factor", factor), ("busbw_gb_per_s", algbw * factor),
                               ("wrong_elems", 0)):
                columns[key].append(value)
    write_bench(path, "comm", columns, world_size=world_size)


def test_bench_comm_gives_the_intra_node_latency_and_bandwidth(tmp_path):
    from scalestudy_analysis.predict.cli import _bench_durations
    _bench_comm(tmp_path / "comm.h5", 12e-6, 300e9)
    measured, message = _bench_durations(tmp_path / "comm.h5")
    assert message is None and list(measured) == ["bench_durations"]
    network = read_network(NETWORKS / "ib-ndr-400.ini")
    comm = fit_comm(measured["bench_durations"], network, [], NCCL_2_23)
    # Exact times: only float rounding separates the fit from the figures that made them.
    # NCCL's ring Simple base is 8.4 µs a call; the rest of the 12 µs is fitted.
    assert comm.base_extra_s == pytest.approx(3.6e-6, rel=1e-6)
    assert comm.intra_bus_bytes_per_s == pytest.approx(300e9, rel=1e-6)
    out = tmp_path / "out"
    assert main([str(EXAMPLE), "--network", str(NETWORKS / "ib-ndr-400.ini"), "--no-ledger",
                 "--resamples", "20", "--bench-comm", str(tmp_path / "comm.h5"),
                 "--out", str(out)]) == 0
    assert "bus bandwidth of 300 GB/s" in (out / "prediction.md").read_text()
    _bench_comm(tmp_path / "one.h5", 12e-6, 300e9, world_size=1)
    assert main([str(EXAMPLE), "--network", str(NETWORKS / "ib-ndr-400.ini"), "--no-ledger",
                 "--bench-comm", str(tmp_path / "one.h5")]) == 2


def test_the_sweeps_own_bench_comm_calibrates_the_fit_unless_bench_comm_is_given(tmp_path, capsys):
    """The sweep tool writes SWEEP/bench-comm/n<N>.h5; predict takes the one of the most
    ranks that reads, names it in its output, and --bench-comm overrides it."""
    sweep = tmp_path / "sweep"
    _transfer(EXAMPLE / "strong" / "ddp-overlap_on", "n[12]-*.h5", sweep, shutil.copy)
    own = sweep / "bench-comm" / "n4.h5"
    own.parent.mkdir()
    _bench_comm(own, 12e-6, 300e9)
    # A failed file of more ranks is passed over, named on stderr.
    failed = sweep / "bench-comm" / "n8.h5"
    _bench_comm(failed, 12e-6, 100e9, world_size=8)
    with h5py.File(failed, "r+") as handle:
        handle.attrs["status"] = "failed"
    base = [str(sweep), "--network", str(NETWORKS / "ib-ndr-400.ini"), "--no-ledger",
            "--resamples", "20"]

    assert main(base + ["--out", str(tmp_path / "own")]) == 0
    printed = capsys.readouterr()
    assert printed.out.splitlines()[0] == f"bench comm: {own}, the sweep's own (--bench-comm overrides it)"
    assert str(failed) in printed.err and "not used" in printed.err
    text = (tmp_path / "own" / "prediction.md").read_text()
    assert f"Collectives calibrated with bench comm: `{own}`, the sweep's own" in text
    assert "bus bandwidth of 300 GB/s" in text
    document = json.loads((tmp_path / "own" / "predictions.json").read_text())["bench_comm"]
    assert document["files"] == [str(own)] and document["source"] == "sweep"
    assert len(document["left_out"]) == 1 and str(failed) in document["left_out"][0]

    given = tmp_path / "given.h5"
    _bench_comm(given, 12e-6, 200e9)
    assert main(base + ["--bench-comm", str(given), "--out", str(tmp_path / "given")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"bench comm: {given} (--bench-comm)"
    text = (tmp_path / "given" / "prediction.md").read_text()
    assert "bus bandwidth of 200 GB/s" in text and "300 GB/s" not in text and str(own) not in text

    shutil.rmtree(sweep / "bench-comm")
    assert main(base + ["--out", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(
        f"bench comm: none found in {sweep / 'bench-comm'}")
    text = (tmp_path / "none" / "prediction.md").read_text()
    assert "No bench comm file" in text and "300 GB/s" not in text
    assert "come from the sweep's collective records" in text


def test_bench_comm_across_nodes_calibrates_the_network_step_and_bandwidth(tmp_path):
    """2 nodes × 2 ranks, times made by NCCL's ring (the PAT table): 8.4 µs a call, 3.4 µs
    an intra step, 20 µs a network step and 2 × 5 GB/s for the node's rings."""
    from dataclasses import replace
    from scalestudy_analysis.predict.cli import _bench_durations
    from scalestudy_analysis.predict.comm import ring_steps
    columns = {key: [] for key in ("collective", "bytes", "elems", "time_median_s",
                                   "algbw_gb_per_s", "bus_factor", "busbw_gb_per_s",
                                   "wrong_elems")}
    for kind in ("allreduce", "reduce_scatter", "allgather"):
        steps, inter = ring_steps(kind, 4, 2)
        for payload in (1 << 12, 1 << 20, 1 << 26):
            seconds = (8.4 + (steps - inter) * 3.4 + inter * 20.0) * US \
                + bus_factor(kind, 4) * payload / 10e9
            for key, value in (("collective", kind), ("bytes", payload), ("elems", payload // 4),
                               ("time_median_s", seconds), ("algbw_gb_per_s", 1.0),
                               ("bus_factor", bus_factor(kind, 4)), ("busbw_gb_per_s", 1.0),
                               ("wrong_elems", 0)):
                columns[key].append(value)
    write_bench(tmp_path / "comm.h5", "comm", columns, world_size=4,
                attrs={"nodes": np.int64(2), "ranks_per_node": np.int64(2)})
    measured, message = _bench_durations(tmp_path / "comm.h5")
    assert message is None and list(measured) == ["bench_inter"]
    assert measured["bench_inter"][1:] == (2, 2)
    notes = []
    comm = fit_comm(None, read_network(NETWORKS / "ib-ndr-400.ini"), notes, NCCL_2_23,
                    inter=measured["bench_inter"])
    # Exact times: float rounding only.
    assert comm.inter_latency_s == pytest.approx(20e-6, rel=1e-6)
    assert comm.inter_bytes_per_s == pytest.approx(5e9, rel=1e-6)
    assert any("calibrated by bench comm on 2 nodes" in note for note in notes)
    two_per_node = replace(comm, gpus_per_node=2)
    assert ring_time("allreduce", 1 << 26, 4, two_per_node) == pytest.approx(
        (8.4 + 4 * 3.4 + 2 * 20.0) * US + 1.5 * (1 << 26) / 10e9, rel=1e-6)


def test_batch_sweep_joins_the_compute_fit_and_must_match_the_model(tmp_path):
    batches = tmp_path / "batches"
    _transfer(EXAMPLE, "n1-*.h5", batches, shutil.copy)
    network = str(NETWORKS / "ib-ndr-400.ini")
    out = tmp_path / "out"
    assert main([str(EXAMPLE), "--network", network, "--no-ledger", "--resamples", "20",
                 "--batch-sweep", str(batches), "--out", str(out)]) == 0
    fitted = (out / "prediction.md").read_text().split("## What was fitted", 1)[1]
    assert "no batch sweep given" not in fitted.split("## Strong scaling", 1)[0]
    assert "Every result file under the sweep entered the fit." in fitted
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(EXAMPLE), "--network", network, "--no-ledger",
                 "--batch-sweep", str(empty)]) == 2


def test_a_ledger_that_cannot_be_read_exits_2_naming_it(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / LEDGER_NAME).write_text("{not json")
    assert main([str(EXAMPLE), "--network", str(NETWORKS / "ib-ndr-400.ini"),
                 "--resamples", "20", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert LEDGER_NAME in error and "--ledger" in error


def test_a_file_that_does_not_read_stops_the_fit_naming_it(tmp_path, capsys):
    """A truncated n4 file hides one repeat of the held-out point: the fit is refused
    naming the file and HDF5's error, and --skip-unreadable fits without it, naming it
    on stderr and in prediction.md. A failed run, whose configuration reads, is named and
    left out without stopping the fit."""
    sweep = tmp_path / "sweep"
    shutil.copytree(EXAMPLE / "strong" / "ddp-overlap_on", sweep / "strong" / "ddp-overlap_on")
    truncated = sweep / "strong" / "ddp-overlap_on" / "n4-r1.h5"
    with open(truncated, "r+b") as handle:
        handle.truncate(truncated.stat().st_size // 2)
    write_run(sweep / "failed.h5", world_size=2, status="failed",
              failure_reason="rank 1: collective allreduce timed out in grad-comm")
    arguments = [str(sweep), "--network", str(NETWORKS / "ib-ndr-400.ini"), "--no-ledger",
                 "--resamples", "20", "--out", str(tmp_path / "out")]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    # The loader's own warning about the unreadable file may come first.
    assert any(line.startswith("scalestudy-predict: error: SWEEP") for line in error.splitlines()), error
    assert f"{truncated}: unreadable: " in error and "truncated file" in error
    assert "failed.h5" not in error and "--skip-unreadable" in error
    assert not (tmp_path / "out").exists()

    assert main(arguments + ["--skip-unreadable"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("scalestudy-predict: warning")]
    assert len(warnings) == 2
    assert any(str(truncated) in line and "truncated file" in line for line in warnings)
    assert any(str(sweep / "failed.h5") in line and "timed out" in line for line in warnings)
    fitted = (tmp_path / "out" / "prediction.md").read_text().split("## What was fitted")[1]
    assert "Left out of the fit" in fitted and str(truncated) in fitted
    assert str(sweep / "failed.h5") in fitted

