"""peers/bench_vs_pytorch.py without a GPU or torch: the rounds' order, the medians of
the rows, the ratios paired within a round, the report, the exit status and the refusals
of bad input. The scalestudy side runs the real CPU build on the tiny preset; PyTorch's
side is written by hand where a test needs it."""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "peers" / "bench_vs_pytorch.py"
sys.path.insert(0, str(ROOT / "peers"))
import bench_vs_pytorch as bench  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
needs_binary = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")
TINY = ["--backend", "cpu", "--precision", "fp32", "--model", "tiny", "--seq", "64", "--batch-per-gpu", "2",
        "--steps", "3", "--warmup", "1"]


def measured(tokens_per_s):
    return {"tokens_per_s": tokens_per_s, "median_step_s": 1.0 / tokens_per_s, "flops_per_step": 1e12}


FAILED = {"failed": "exited with 1"}


def test_rows_are_medians_of_the_rounds_and_ratios_are_paired_within_each_round():
    one = bench.Run(1, bench.BASELINE, "bf16", "ddp")
    compiled = bench.Run(1, "pytorch compile", "bf16", mode="compile")
    two = bench.Run(2, bench.BASELINE, "bf16", "ddp")
    results = {one: [measured(100.0), measured(110.0), measured(90.0)],
               compiled: [measured(80.0), measured(100.0), measured(75.0)],
               two: [measured(190.0), measured(200.0), measured(180.0)]}
    rows, comparisons, factors = bench.summarise([one, compiled, two], results)
    assert [r["tokens_per_s"] for r in rows] == [100.0, 80.0, 190.0]
    # Within the rounds: 100/80, 110/100, 90/75. The median of the three, 1.2, is not the
    # ratio of the rows' medians, 1.25: a round's two runs share the machine's state.
    [comparison] = comparisons
    assert comparison["ratio"] == pytest.approx(1.2)
    assert (comparison["low"], comparison["high"], comparison["rounds"]) == (pytest.approx(1.1), 1.25, 3)
    [factor] = factors
    assert factor["ratio"] == pytest.approx(1.9) and factor["high"] == pytest.approx(2.0)
    # TFLOP/s per GPU from the scalestudy file's FLOPs at the same GPU count, for PyTorch's row too.
    assert rows[1]["tflops_per_gpu"] == pytest.approx(1e12 * 80.0 / 1e12)
    assert rows[2]["tflops_per_gpu"] == pytest.approx(1e12 * 190.0 / 2 / 1e12)


def test_a_variant_scales_from_its_own_one_gpu_run_and_zero2_from_the_baseline():
    base_one = bench.Run(1, bench.BASELINE, "bf16", "ddp")
    variant_one = bench.Run(1, f"{bench.BASELINE} [fast]", "bf16", "ddp", "--gemm-algos-file algos.txt")
    base_two = bench.Run(2, bench.BASELINE, "bf16", "ddp")
    variant_two = bench.Run(2, f"{bench.BASELINE} [fast]", "bf16", "ddp", "--gemm-algos-file algos.txt")
    zero2_two = bench.Run(2, "scalestudy zero2+overlap", "bf16", "zero2")
    runs = [base_one, variant_one, base_two, variant_two, zero2_two]
    results = {base_one: [measured(100.0)], variant_one: [measured(110.0)], base_two: [measured(190.0)],
               variant_two: [measured(198.0)], zero2_two: [measured(192.0)]}
    _, _, factors = bench.summarise(runs, results)
    by_run = {f["run"]: f for f in factors}
    # The variant's 198 over its own 110 (1.8), not over the baseline's 100 (1.98).
    assert by_run[variant_two.name]["over"] == variant_one.name
    assert by_run[variant_two.name]["ratio"] == pytest.approx(1.8)
    assert by_run[zero2_two.name]["over"] == bench.BASELINE
    assert by_run[zero2_two.name]["ratio"] == pytest.approx(1.92)
    assert by_run[bench.BASELINE]["ratio"] == pytest.approx(1.9)
    report = bench.format_report(*bench.summarise(runs, results), rounds=1)
    assert f"{variant_two.name} on 2 GPUs over {variant_one.name} on 1 GPU, vocab 0: 1.800x" in report


def test_a_failed_round_leaves_its_pair_out_and_a_run_that_never_ran_has_no_figures():
    one = bench.Run(1, bench.BASELINE, "bf16", "ddp")
    eager = bench.Run(1, "pytorch eager", "bf16", mode="eager")
    results = {one: [measured(100.0), measured(300.0), measured(90.0)],
               eager: [measured(50.0), FAILED, measured(60.0)]}
    rows, [comparison], _ = bench.summarise([one, eager], results)
    assert comparison["rounds"] == 2 and comparison["ratio"] == pytest.approx((2.0 + 1.5) / 2)
    assert rows[1]["tokens_per_s"] == 55.0 and rows[1]["rounds"][1] == FAILED
    results = {one: [FAILED, FAILED, FAILED], eager: [measured(50.0), FAILED, None]}
    rows, [comparison], _ = bench.summarise([one, eager], results)
    assert comparison["rounds"] == 0
    assert rows[1]["rounds"][2] == {"failed": "not run"}
    report = bench.format_report(rows, [comparison], [], 3)
    assert "| 1 | 0 | scalestudy ddp+overlap | bf16 | failed | | | 0 of 3 |" in report
    assert "over pytorch eager (bf16) on 1 GPU(s), vocab 0: no round gave both runs" in report


def test_each_scalestudy_variant_gets_its_own_ratio_after_the_baselines():
    one = bench.Run(1, bench.BASELINE, "bf16", "ddp")
    tuned = bench.Run(1, bench.BASELINE + " [tuned]", "bf16", "ddp", "--gemm-algos-file algos.txt")
    compiled = bench.Run(1, "pytorch compile", "bf16", mode="compile")
    results = {tuned: [measured(130.0), measured(132.0)], one: [measured(125.0), measured(126.0)],
               compiled: [measured(100.0), measured(100.0)]}
    rows, comparisons, _ = bench.summarise([tuned, one, compiled], results)
    assert [(c["run"], c["against"]) for c in comparisons] == [(one.name, compiled.name), (tuned.name, compiled.name)]
    assert comparisons[1]["ratio"] == pytest.approx(1.31)
    report = bench.format_report(rows, comparisons, [], 2)
    assert ("scalestudy ddp+overlap [tuned] over pytorch compile (bf16) on 1 GPU(s), vocab 0: 1.310x "
            "(median of 2 rounds; 1.300 to 1.320)") in report


def test_the_report_cuts_ratios_to_three_decimals_with_the_rounds_range():
    one = bench.Run(1, bench.BASELINE, "bf16", "ddp")
    compiled = bench.Run(1, "pytorch compile", "bf16", mode="compile")
    results = {one: [measured(1249.6), measured(1300.0)], compiled: [measured(1000.0), measured(1000.0)]}
    report = bench.format_report(*bench.summarise([one, compiled], results), 2)
    # 1.2496 reads as 1.249, not as the 1.250 that rounding gives: a ratio must not appear
    # to reach a bar it misses. The median of 1.2496 and 1.3 is 1.2748.
    assert ("scalestudy ddp+overlap over pytorch compile (bf16) on 1 GPU(s), vocab 0: 1.274x "
            "(median of 2 rounds; 1.249 to 1.300)") in report
    one_round = {one: [measured(1249.6)], compiled: [measured(1000.0)]}
    report = bench.format_report(*bench.summarise([one, compiled], one_round), 1)
    assert "on 1 GPU(s), vocab 0: 1.249x\n" in report + "\n"
    assert "| 1 | 0 | pytorch compile | bf16 | 1,000 | 1000.0 | 0.800 | 1 of 1 |" in report


def test_ratios_and_factors_pair_runs_of_the_same_vocabulary_only():
    ours = {vocab: bench.Run(1, bench.BASELINE, "bf16", "ddp", vocab=vocab) for vocab in (50304, 50257)}
    theirs = {vocab: bench.Run(1, "pytorch compile", "bf16", mode="compile", vocab=vocab) for vocab in (50304, 50257)}
    two = bench.Run(2, bench.BASELINE, "bf16", "ddp", vocab=50257)
    runs = [ours[50304], theirs[50304], ours[50257], theirs[50257], two]
    results = {ours[50304]: [measured(120.0)], theirs[50304]: [measured(100.0)],
               ours[50257]: [measured(110.0)], theirs[50257]: [measured(80.0)], two: [measured(209.0)]}
    rows, comparisons, factors = bench.summarise(runs, results)
    assert [(c["vocab"], c["ratio"]) for c in comparisons] == [(50304, pytest.approx(1.2)),
                                                               (50257, pytest.approx(1.375))]
    [factor] = factors
    assert (factor["vocab"], factor["ratio"]) == (50257, pytest.approx(1.9))
    # Each row's "vs scalestudy" is against scalestudy at its own vocabulary.
    report = bench.format_report(rows, comparisons, factors, 1)
    assert "| 1 | 50257 | pytorch compile | bf16 | 80 | 80.0 | 0.727 | 1 of 1 |" in report


def test_the_default_vocabulary_is_the_presets_padded_to_a_multiple_of_64():
    assert [bench.padded_vocab(v) for v in (64, 50257, 30522, 65)] == [64, 50304, 30528, 128]


def test_even_rounds_run_in_reverse_order():
    runs = ["a", "b", "c"]
    assert bench.round_order(runs, 0) == ["a", "b", "c"]
    assert bench.round_order(runs, 1) == ["c", "b", "a"]
    assert bench.round_order(runs, 2) == ["a", "b", "c"]


def test_each_pytorch_mode_reaches_the_worker_and_the_worker_takes_it():
    args = bench.parser().parse_args(["--binary", "scalestudy", "--batch-per-gpu", "8",
                                      "--pytorch-modes", "compile", "max-autotune"])
    args.vocab, args.pytorch_gpus, args.pytorch_precisions = [50304], args.gpus, ["bf16"]
    runs = [run for run in bench.plan(args) if run.side == "pytorch"]
    assert [run.name for run in runs] == ["pytorch compile", "pytorch max-autotune"]
    for run in runs:
        command = bench.pytorch_command(args, run)
        assert command[command.index("--mode") + 1] == run.mode
    # The worker's own parser, which needs no torch to answer --help, offers every mode.
    usage = subprocess.run([sys.executable, str(ROOT / "peers" / "train_torch.py"), "--help"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "{eager,compile,max-autotune}" in usage


def run_script(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


@needs_binary
def test_a_cpu_run_of_two_rounds_reads_every_file_and_pairs_the_factors(tmp_path):
    document = tmp_path / "bench.json"
    done = run_script("--binary", BINARY, *TINY, "--gpus", "1", "2", "--rounds", "2",
                      "--workdir", str(tmp_path / "runs"), "--json", str(document))
    assert done.returncode == 0, done.stdout + done.stderr
    order = [line.split("] ", 1)[1].split(":")[0] for line in done.stdout.splitlines() if line.startswith("[round")]
    first = ["1 GPU(s), vocab 64, scalestudy ddp+overlap fp32", "2 GPU(s), vocab 64, scalestudy ddp+overlap fp32",
             "2 GPU(s), vocab 64, scalestudy zero2+overlap fp32"]
    assert order == first + first[::-1]
    doc = json.loads(document.read_text())
    assert [(r["gpus"], r["name"]) for r in doc["rows"]] == [(1, "scalestudy ddp+overlap"),
                                                             (2, "scalestudy ddp+overlap"),
                                                             (2, "scalestudy zero2+overlap")]
    for row in doc["rows"]:
        rates = []
        for result in row["rounds"]:
            with h5py.File(result["file"], "r") as handle:
                rates.append(float(handle["summary"].attrs["tokens_per_s"]))
            assert result["tokens_per_s"] == rates[-1]
        assert row["tokens_per_s"] == pytest.approx(statistics.median(rates), rel=1e-12)
    one = doc["rows"][0]["rounds"]
    for factor, row in zip(doc["factors"], doc["rows"][1:]):
        within = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(row["rounds"], one)]
        assert factor["ratio"] == pytest.approx(statistics.median(within), rel=1e-12)
        assert (factor["low"], factor["high"]) == (pytest.approx(min(within)), pytest.approx(max(within)))
    assert "scalestudy zero2+overlap on 2 GPUs over scalestudy ddp+overlap on 1 GPU, vocab 64: " in done.stdout
    assert doc["comparisons"] == []


@needs_binary
def test_each_vocabulary_reaches_scalestudy(tmp_path):
    document = tmp_path / "bench.json"
    done = run_script("--binary", BINARY, *TINY, "--vocab", "64", "96", "--workdir", str(tmp_path / "runs"),
                      "--json", str(document))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(document.read_text())["rows"]
    assert [row["vocab"] for row in rows] == [64, 96]
    for row in rows:
        with h5py.File(row["rounds"][0]["file"], "r") as handle:
            assert int(handle["config"].attrs["vocab"]) == row["vocab"]


@needs_binary
def test_a_run_that_fails_makes_the_exit_status_1_and_keeps_the_others(tmp_path):
    document = tmp_path / "bench.json"
    done = run_script("--binary", BINARY, *TINY, "--scalestudy-variants", "broken=--no-such-option",
                      "--workdir", str(tmp_path / "runs"), "--json", str(document))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "| 1 | 64 | scalestudy ddp+overlap [broken] | fp32 | failed | | | 0 of 1 |" in done.stdout
    rows = json.loads(document.read_text())["rows"]
    assert rows[0]["tokens_per_s"] > 0 and rows[1]["rounds"] == [{"failed": "exited with 2"}]
    assert rows[1]["tokens_per_s"] is None


@pytest.mark.parametrize("args, named", [
    (["--batch-per-gpu", "0"], "--batch-per-gpu"),
    (["--rounds", "0"], "--rounds"),
    (["--warmup", "-1"], "--warmup"),
    (["--timeout-s", "0"], "--timeout-s"),
    (["--gpus", "two"], "--gpus"),
    (["--vocab", "0"], "--vocab"),
    (["--scalestudy-variants", "no name=--overlap off"], "--scalestudy-variants"),
])
def test_bad_values_exit_2_naming_the_option(args, named, tmp_path):
    done = run_script("--binary", sys.executable, *args, cwd=tmp_path)
    assert done.returncode == 2 and named in done.stderr, done.stderr


@needs_binary
@pytest.mark.parametrize("args, named", [
    (["--binary", "/no/such/scalestudy"], "--binary /no/such/scalestudy"),
    (["--backend", "cpu", "--pytorch-modes", "compile"], "--pytorch-modes"),
    (["--model", "no-such-model"], "--model no-such-model"),
    (["--model", "tiny", "--pytorch-modes", "eager"], "--model tiny"),
    (["--gpus", "1", "--pytorch-gpus", "4"], "--pytorch-gpus 4"),
])
def test_inputs_that_cannot_run_exit_2_naming_the_option(args, named, tmp_path):
    done = run_script("--binary", BINARY, "--workdir", str(tmp_path), *args, cwd=tmp_path)
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert "$ " not in done.stdout  # nothing ran


def test_nccl_keeps_its_defaults_but_for_the_callers_settings(monkeypatch):
    for name in [name for name in os.environ if name.startswith("NCCL_")]:
        monkeypatch.delenv(name)
    assert not any(arg.startswith("NCCL") for arg in bench.launcher(2))
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    command = bench.launcher(2)
    assert command[command.index("-x") + 1] == "NCCL_NVLS_ENABLE"
