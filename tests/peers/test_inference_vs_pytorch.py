"""peers/inference_vs_pytorch.py without a GPU or torch: the join of a `bench inference`
file with PyTorch's points, the speedups, the marks against the bar, the printed table and
the JSON. The scalestudy side is a real CPU file of the tiny preset; PyTorch's side is
written by hand, its latencies set as exact multiples of scalestudy's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "peers"))
import inference_vs_pytorch as grid  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
needs_binary = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")
BATCHES, SEQS = (1, 8), (8, 16)
QUICK = "--warmup 1 --repeats 3 --min-sample-ms 0.2"
HEADROOM_BYTES = 128 << 20  # the bench's fixed head-room (docs/results-schema.md, "Benchmark files")


def pytorch_point(mode, batch, seq, latency_ms=None):
    if latency_ms is None:
        return {"batch": batch, "seq": seq, "mode": mode, "status": "oom", "detail": "torch.OutOfMemoryError"}
    return {"batch": batch, "seq": seq, "mode": mode, "status": "ok", "detail": "", "latency_ms": latency_ms,
            "sequences_per_s": batch / latency_ms * 1e3}


def ours(latency_ms, status="ok"):
    return {"status": status, "latency_ms": latency_ms if status == "ok" else float("nan")}


def test_speedups_are_pytorch_time_over_ours_and_the_marks_follow_the_bar():
    scalestudy = {(1, 64): ours(2.0), (8, 64): ours(2.0), (4, 64): ours(2.0), (16, 64): ours(4.0),
                  (32, 64): ours(0.0, "oom"), (64, 64): ours(0.0, "oom")}
    pytorch = [pytorch_point("eager", 1, 64, 1.0), pytorch_point("compile", 1, 64, 1.0),   # both faster, batch 1
               pytorch_point("eager", 4, 64, 4.0), pytorch_point("compile", 4, 64, 1.0),   # compile faster, batch 4
               pytorch_point("eager", 8, 64, 4.0), pytorch_point("compile", 8, 64, 1.0),   # compile faster, batch 8
               pytorch_point("eager", 16, 64, 4.0), pytorch_point("compile", 16, 64, 4.0),  # a tie misses nothing
               pytorch_point("eager", 32, 64, 9.0), pytorch_point("compile", 32, 64),       # ours oom, eager ran
               pytorch_point("eager", 64, 64), pytorch_point("compile", 64, 64)]            # every side oom
    rows = {(r["batch"], r["seq"]): r for r in grid.join(scalestudy, pytorch, [1, 4, 8, 16, 32, 64, 128], [64])}
    assert rows[(1, 64)]["speedup_vs_eager"] == 0.5 and rows[(1, 64)]["marks"] == ["slower than eager"]
    # Below batch 8 the bar asks nothing of compile: batch 4 passes, batch 8 does not.
    assert rows[(4, 64)]["speedup_vs_compile"] == 0.5 and rows[(4, 64)]["marks"] == []
    assert rows[(8, 64)]["speedup_vs_eager"] == 2.0 and rows[(8, 64)]["marks"] == ["slower than compile"]
    assert rows[(16, 64)]["speedup_vs_compile"] == 1.0 and rows[(16, 64)]["marks"] == []
    assert rows[(32, 64)]["marks"] == ["scalestudy oom where PyTorch ran"]
    assert rows[(32, 64)]["speedup_vs_eager"] is None and rows[(32, 64)]["eager_qps"] == pytest.approx(32 / 9e-3)
    assert rows[(64, 64)]["marks"] == []
    assert rows[(128, 64)]["scalestudy_status"] == "missing" and rows[(128, 64)]["marks"] == []
    assert rows[(8, 64)]["scalestudy_qps"] == 4000.0  # 8 sequences in 2 ms
    table = grid.format_table("m", list(rows.values()))
    assert "| 8 | 64 | 2 | 4 | 1 | 4,000 | 2,000 | 8,000 | 2.000× | 0.500× | slower than compile |" in table
    assert "| 32 | 64 | oom | 9 | oom | oom | 3,556 | oom | — | — | scalestudy oom where PyTorch ran |" in table
    assert "m: 3 of 7 points miss the bar" in table


def bench_inference(path, *options):
    subprocess.run([BINARY, "bench", "inference", "--batches", ",".join(map(str, BATCHES)),
                    "--seqs", ",".join(map(str, SEQS)), *QUICK.split(), *options, "-o", str(path)],
                   check=True, capture_output=True, timeout=300)
    with h5py.File(path, "r") as handle:
        group = handle["bench/inference"]
        return {(int(b), int(s)): (status, float(latency), int(memory)) for b, s, status, latency, memory in zip(
            group["batch"][()], group["seq"][()], group["status"].asstr()[()], group["latency_ms"][()],
            group["memory_bytes"][()])}


def limit_that_fits_all_but_the_largest(points):
    """A --memory-limit under which every point but the largest is predicted to fit."""
    needed = sorted(memory + memory // 20 + HEADROOM_BYTES for _, _, memory in points.values())
    assert needed[-2] < needed[-1]
    return needed[-2]


def hand_written_pytorch(path, shape, measured):
    """PyTorch's side of the tiny grid, each latency a power-of-two multiple of ours, so that
    each speedup is exact: (1, 8) below eager, (8, 8) below compile at batch 8, (1, 16) a tie,
    (8, 16) not run by scalestudy (oom) where eager ran."""
    ms = {key: latency for key, (_, latency, _) in measured.items()}
    points = [pytorch_point("eager", 1, 8, ms[(1, 8)] / 2), pytorch_point("compile", 1, 8, ms[(1, 8)] * 4),
              pytorch_point("eager", 8, 8, ms[(8, 8)] * 2), pytorch_point("compile", 8, 8, ms[(8, 8)] / 4),
              pytorch_point("eager", 1, 16, ms[(1, 16)]), pytorch_point("compile", 1, 16, ms[(1, 16)]),
              pytorch_point("eager", 8, 16, 5.0), pytorch_point("compile", 8, 16)]
    doc = {"kind": grid.JSON_KIND, "version": grid.JSON_VERSION, "argv": [], "settings": {},
           "machine": {"torch": "2.9.0", "torch_cuda": "12.8", "gpu": "hand-written"},
           "models": {"tiny": {"shape": shape, "pytorch": points}}}
    path.write_text(json.dumps(doc))


def run_script(capsys, *args):
    code = grid.main([str(a) for a in args])
    return code, capsys.readouterr()


@needs_binary
def test_a_cpu_bench_file_joins_with_hand_written_pytorch_points(tmp_path, capsys):
    measured = bench_inference(tmp_path / "probe.h5")
    limit = limit_that_fits_all_but_the_largest(measured)
    scalestudy_file = tmp_path / "tiny.h5"
    measured = bench_inference(scalestudy_file, "--memory-limit", str(limit))
    assert [status for status, _, _ in measured.values()] == ["ok", "ok", "ok", "oom"]
    shape = grid.read_scalestudy_file(scalestudy_file)["shape"]
    assert shape == {"layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "max_seq": 16, "attention": "causal"}
    hand_written_pytorch(tmp_path / "pytorch.json", shape, measured)

    out = tmp_path / "grid.json"
    code, printed = run_script(capsys, "--models", "tiny", "--batches", *BATCHES, "--seqs", *SEQS,
                               "--scalestudy-file", f"tiny={scalestudy_file}", "--pytorch-file",
                               tmp_path / "pytorch.json", "--json", out)
    assert code == 0, printed.err
    doc = json.loads(out.read_text())
    assert doc["kind"] == grid.JSON_KIND and doc["machine"]["gpu"] == "hand-written"
    entry = doc["models"]["tiny"]
    assert entry["shape"] == shape and entry["scalestudy"]["status"] == "complete"
    assert len(entry["pytorch"]) == 8
    rows = {(r["batch"], r["seq"]): r for r in entry["joined"]}
    assert [(r["batch"], r["seq"]) for r in entry["joined"]] == [(1, 8), (8, 8), (1, 16), (8, 16)]
    assert (rows[(1, 8)]["speedup_vs_eager"], rows[(1, 8)]["speedup_vs_compile"]) == (0.5, 4.0)
    assert (rows[(8, 8)]["speedup_vs_eager"], rows[(8, 8)]["speedup_vs_compile"]) == (2.0, 0.25)
    assert rows[(1, 16)]["speedup_vs_eager"] == 1.0
    assert rows[(1, 8)]["scalestudy_ms"] == measured[(1, 8)][1]
    assert rows[(8, 8)]["scalestudy_qps"] == pytest.approx(8 / measured[(8, 8)][1] * 1e3, rel=1e-12)
    assert [r["marks"] for r in entry["joined"]] == [
        ["slower than eager"], ["slower than compile"], [], ["scalestudy oom where PyTorch ran"]]
    assert "tiny: 3 of 4 points miss the bar" in printed.out
    assert "| 8 | 16 | oom | 5 | oom | oom | 1,600 | oom | — | — | scalestudy oom where PyTorch ran |" in printed.out

    # The JSON it writes is a PyTorch file for the next run, which gives the same table.
    code, again = run_script(capsys, "--models", "tiny", "--batches", *BATCHES, "--seqs", *SEQS,
                             "--scalestudy-file", f"tiny={scalestudy_file}", "--pytorch-file", out)
    assert code == 0 and again.out.split("## tiny")[1] == printed.out.split("## tiny")[1].split("wrote")[0]


@needs_binary
def test_it_runs_the_binary_once_per_model_and_names_bad_inputs(tmp_path, capsys):
    measured = bench_inference(tmp_path / "probe.h5")
    shape = grid.read_scalestudy_file(tmp_path / "probe.h5")["shape"]
    hand_written_pytorch(tmp_path / "pytorch.json", shape, measured)
    common = ["--binary", BINARY, "--backend", "cpu", "--precision", "fp32", "--models", "tiny",
              "--batches", *BATCHES, "--seqs", *SEQS, "--workdir", tmp_path / "work"]
    code, printed = run_script(capsys, *common, "--scalestudy-options", QUICK, "--pytorch-file",
                               tmp_path / "pytorch.json")
    assert code == 0, printed.err
    assert "bench inference --backend cpu --precision fp32 --model tiny --batches 1,8 --seqs 8,16" in printed.out
    assert grid.read_scalestudy_file(tmp_path / "work" / "inference-tiny.h5")["status"] == "complete"
    assert "tiny: " in printed.out and "points miss the bar" in printed.out

    other = json.loads((tmp_path / "pytorch.json").read_text())
    other["models"]["tiny"]["shape"]["hidden"] = 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    bad = [(["--pytorch-file", tmp_path / "other.json", "--scalestudy-file", f"tiny={tmp_path / 'probe.h5'}"],
            "not the same model"),
           (["--pytorch-file", tmp_path / "pytorch.json", "--scalestudy-file", f"base={tmp_path / 'probe.h5'}"],
            "--scalestudy-file names base"),
           (["--pytorch-file", tmp_path / "pytorch.json", "--scalestudy-file", "tiny=/nonexistent.h5"],
            "no such file")]
    for extra, message in bad:
        code, printed = run_script(capsys, *common, *extra)
        assert code == grid.USAGE_ERROR and message in printed.err, (extra, printed.err)
    (tmp_path / "wrong-kind.json").write_text(json.dumps({"kind": "something else", "version": 1}))
    for name, message in (("wrong-kind.json", "is not a version-1 file of this script"),
                          ("probe.h5", "probe.h5: "), ("missing.json", "No such file")):
        code, printed = run_script(capsys, *common, "--pytorch-file", tmp_path / name)
        assert code == grid.USAGE_ERROR and message in printed.err, (name, printed.err)
    code, printed = run_script(capsys, *common, "--pytorch-file", tmp_path / "pytorch.json",
                               "--scalestudy-file", f"tiny={tmp_path / 'pytorch.json'}")
    assert code == grid.USAGE_ERROR and "not an HDF5 file" in printed.err
