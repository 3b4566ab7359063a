"""The bench report's inference grid (with PyTorch's points beside it) and the layer points
against their device's roofline, on synthetic files with known answers and, when
SCALESTUDY_BINARY names the C++ binary, on real CPU files from it."""
import json
import os
import subprocess

import pytest

from scalestudy_analysis import bench
from test_bench import bandwidth_columns, gemm_columns, write_bench

BINARY = os.environ.get("SCALESTUDY_BINARY")
H100 = "NVIDIA H100 80GB HBM3"
SHAPE = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 30522, "max_seq": 4096, "attention": "bidirectional"}


def inference_columns(points):
    """points: (batch, seq, seconds or a status)."""
    columns = {k: [] for k in ("batch", "seq", "flops", "bytes", "arithmetic_intensity", "time_median_s",
                               "latency_ms", "sequences_per_s", "tokens_per_s", "tflops", "memory_bytes",
                               "status")}
    for batch, seq, seconds in points:
        ok = not isinstance(seconds, str)
        t = seconds if ok else float("nan")
        for key, value in (("batch", batch), ("seq", seq), ("flops", 1e12), ("bytes", 1e9),
                           ("arithmetic_intensity", 1e3), ("time_median_s", t), ("latency_ms", t * 1e3),
                           ("sequences_per_s", batch / t), ("tokens_per_s", batch * seq / t), ("tflops", 1 / t),
                           ("memory_bytes", 1), ("status", "ok" if ok else seconds)):
            columns[key].append(value)
    return columns


def write_inference(path, model="bert-base", device=f"{H100} (sm_90, 132 SMs, 79.2 GiB)", shape=SHAPE):
    method = {"timing": "synthetic", "model": model, **{key: str(value) for key, value in shape.items()}}
    write_bench(path, "inference", inference_columns([(1, 64, 1e-3), (8, 64, 2e-3), (1, 128, 4e-3),
                                                      (8, 128, "oom")]), device=device, method=method,
                precision="bf16")


def write_pytorch(path, points, gpu=H100, model="bert-base", shape=SHAPE):
    """points: (mode, batch, seq, latency ms or None for oom)."""
    rows = [{"batch": b, "seq": s, "mode": mode, "status": "ok" if ms else "oom", "detail": "",
             "latency_ms": ms, "sequences_per_s": b / ms * 1e3 if ms else None} for mode, b, s, ms in points]
    path.write_text(json.dumps({"kind": "scalestudy inference vs pytorch", "version": 1, "argv": [],
                                "machine": {"gpu": gpu, "torch": "2.11.0"}, "settings": {"compile_scope": "regional"},
                                "models": {model: {"shape": shape, "pytorch": rows}}}))


def report(tmp_path, files, *extra):
    out = tmp_path / "out"
    code = bench.main([str(f) for f in files] + ["-o", str(out)] + [str(e) for e in extra])
    return code, out


def markdown_table(text, title):
    """The rows of the first table under the bold title, as lists of cells."""
    block = next(b for b in text.split(f"**{title}")[1].split("\n\n") if b.startswith("|"))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_speedups_against_pytorch_are_its_latency_over_ours_with_every_missing_side_named(tmp_path):
    write_inference(tmp_path / "inference.h5")
    write_pytorch(tmp_path / "pytorch.json", [("eager", 1, 64, 2.0), ("compile", 1, 64, 0.5),
                                              ("eager", 8, 64, None), ("compile", 8, 64, 3.0),
                                              ("eager", 8, 128, 9.0)])
    code, out = report(tmp_path, [tmp_path / "inference.h5"], "--pytorch", tmp_path / "pytorch.json")
    assert code == 0
    text = (out / "bench-report.md").read_text()
    eager = markdown_table(text, "Speedup against PyTorch eager")
    compile_ = markdown_table(text, "Speedup against PyTorch compile")
    # Columns: batch, seq 64, seq 128. Ours at (8, 64) is 2 ms; PyTorch has no (1, 128).
    assert eager == [["1", "2.000", "—"], ["8", "PyTorch oom", "OOM"]]
    assert compile_ == [["1", "0.500", "—"], ["8", "1.500", "OOM"]]
    assert "![inference grid](inference-grid.png)" in text and (out / "inference-grid.png").stat().st_size > 0


@pytest.mark.parametrize("change, note", [({"gpu": "NVIDIA H200"}, "not side by side"),
                                          ({"model": "bert-large"}, "has no model 'bert-base'"),
                                          ({"shape": dict(SHAPE, heads=16)}, "differs from"),
                                          ({"shape": dict(SHAPE, attention="causal")}, "in attention")])
def test_pytorch_points_of_another_gpu_or_model_are_not_drawn_and_the_report_says_why(tmp_path, change, note):
    write_inference(tmp_path / "inference.h5")
    write_pytorch(tmp_path / "pytorch.json", [("eager", 1, 64, 2.0)], **change)
    code, out = report(tmp_path, [tmp_path / "inference.h5"], "--pytorch", tmp_path / "pytorch.json")
    text = (out / "bench-report.md").read_text()
    assert code == 0 and note in text and "Speedup against" not in text
    assert (out / "inference-grid.png").exists()


def test_a_pytorch_file_of_another_kind_is_a_usage_error(tmp_path, capsys):
    write_inference(tmp_path / "inference.h5")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "something else", "version": 1}))
    (tmp_path / "broken.json").write_text("{")
    for name in ("other.json", "broken.json", "missing.json"):
        code, _ = report(tmp_path, [tmp_path / "inference.h5"], "--pytorch", tmp_path / name)
        assert code == bench.USAGE_ERROR and f"--pytorch {tmp_path / name}" in capsys.readouterr().err


def layer_columns(points):
    """points: (part, pass, arithmetic intensity, TFLOP/s); one second per call."""
    columns = {k: [] for k in ("part", "pass", "batch", "seq", "flops", "bytes", "arithmetic_intensity", "tflops",
                               "memory_bytes", "time_median_s")}
    for part, phase, intensity, tflops in points:
        for key, value in (("part", part), ("pass", phase), ("batch", 4), ("seq", 128), ("flops", tflops * 1e12),
                           ("bytes", tflops * 1e12 / intensity), ("arithmetic_intensity", intensity),
                           ("tflops", tflops), ("memory_bytes", 1), ("time_median_s", 1.0)):
            columns[key].append(value)
    return columns


def test_layer_points_meet_the_roof_of_their_own_precision_at_their_intensity(tmp_path):
    # bf16 GEMM 2·1024³ in 10 µs: 214.7 TFLOP/s (fp32 100× slower); copy of 16 Mi elements in
    # 1 ms: 134.2 GB/s. Ridge at 1600 FLOP/byte.
    write_bench(tmp_path / "gemm.h5", "gemm", gemm_columns([("fp32", 1024, 1e-3), ("bf16", 1024, 1e-5)]))
    write_bench(tmp_path / "bw.h5", "bandwidth", bandwidth_columns([("copy", 1 << 24, 1e-3)]))
    method = {"timing": "synthetic", "byte_model": "per op: every tensor it reads once; fp32; traffic inside an op not counted"}
    write_bench(tmp_path / "layer.h5", "layer", layer_columns([("ffn", "forward", 1e4, 107.37),
                                                               ("attention-core", "forward", 100.0, 6.7108864)]),
                method=method, precision="bf16")
    code, out = report(tmp_path, [tmp_path / name for name in ("gemm.h5", "bw.h5", "layer.h5")])
    assert code == 0
    text = (out / "bench-report.md").read_text()
    rows = markdown_table(text, "Against the roofline of cpu")
    peak, bandwidth = 2 * 1024 ** 3 / 1e-5 / 1e12, 8 * (1 << 24) / 1e-3 / 1e9
    assert rows[0] == ["ffn forward b4 s128", "107.4", "1e+04", f"{peak:.4g}", "50.0 %", "compute"]
    assert rows[1] == ["attention-core forward b4 s128", "6.711", "100", f"{bandwidth * 100 / 1e3:.4g}", "50.0 %",
                       "memory"]
    assert "its bf16 kernels move about half those bytes" in text
    assert (out / "layer-roofline.png").stat().st_size > 0


def test_without_a_gemm_of_the_layer_precision_there_is_no_roof(tmp_path):
    write_bench(tmp_path / "gemm.h5", "gemm", gemm_columns([("fp32", 1024, 1e-3)]))
    write_bench(tmp_path / "bw.h5", "bandwidth", bandwidth_columns([("copy", 1 << 24, 1e-3)]))
    write_bench(tmp_path / "layer.h5", "layer", layer_columns([("ffn", "forward", 1e4, 1.0)]), precision="bf16")
    code, out = report(tmp_path, [tmp_path / name for name in ("gemm.h5", "bw.h5", "layer.h5")])
    text = (out / "bench-report.md").read_text()
    assert code == 0 and "No roof: no bf16 gemm point for this device" in text
    code, out = report(tmp_path, [tmp_path / "layer.h5"])
    text = (out / "bench-report.md").read_text()
    assert "No roof: no gemm file for this device; no bandwidth file for this device" in text
    assert not (out / "layer-roofline.png").exists()


@pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")
def test_real_cpu_files_draw_the_grid_beside_pytorch_and_the_layer_against_the_roof(tmp_path):
    quick = ["--warmup", "1", "--repeats", "3", "--min-sample-ms", "0.2"]
    for name, options in (("gemm", ["--sizes", "32,64"]), ("bandwidth", ["--sizes", "4K,16K"]),
                          ("layer", ["--batches", "1", "--seqs", "8"]),
                          ("inference", ["--batches", "1,2", "--seqs", "8,16"])):
        subprocess.run([BINARY, "bench", name, *options, *quick, "-o", str(tmp_path / f"{name}.h5")], check=True,
                       capture_output=True, timeout=300)
    inference = bench.read_bench_file(tmp_path / "inference.h5")
    shape = {key: (inference.method[key] if key == "attention" else int(inference.method[key]))
             for key in ("layers", "hidden", "heads", "vocab", "max_seq", "attention")}
    ours = inference.points.set_index(["batch", "seq"])["latency_ms"]
    write_pytorch(tmp_path / "pytorch.json", [("eager", 1, 8, ours[(1, 8)] * 2), ("compile", 2, 16, ours[(2, 16)])],
                  gpu=inference.device, model="tiny", shape=shape)
    code, out = report(tmp_path, [tmp_path / f"{name}.h5" for name in ("gemm", "bandwidth", "layer", "inference")],
                       "--pytorch", tmp_path / "pytorch.json")
    assert code == 0
    text = (out / "bench-report.md").read_text()
    assert markdown_table(text, "Speedup against PyTorch eager") == [["1", "2.000", "—"], ["2", "—", "—"]]
    assert markdown_table(text, "Speedup against PyTorch compile") == [["1", "—", "—"], ["2", "—", "1.000"]]
    layer = bench.read_bench_file(tmp_path / "layer.h5")
    rows = markdown_table(text, "Against the roofline of cpu")
    assert len(rows) == int((layer.points["status"] == "ok").sum()) > 0
    assert all(row[4].endswith(" %") for row in rows)
    for name in ("inference-grid.png", "layer-roofline.png", "roofline.png"):
        assert (out / name).stat().st_size > 0
