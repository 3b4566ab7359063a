"""The benchmark report on synthetic bench files with known answers, and (when
SCALESTUDY_BINARY names the C++ binary) on real CPU bench files from it: its tables and
roofline, the inference grid with PyTorch's points beside it, and the layer points
against their device's roofline."""
import json
import math
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from scalestudy_analysis.bench import report as bench
from scalestudy_analysis.report.bandwidth import nearest_bench
from synth import base_config, write_run

BINARY = os.environ.get("SCALESTUDY_BINARY")
MPIEXEC = shutil.which("mpiexec")
H100 = "NVIDIA H100 80GB HBM3"
SHAPE = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 30522, "max_seq": 4096, "attention": "bidirectional"}


def write_bench(path, name, columns, *, status="complete", device="cpu", world_size=1, method=None,
                repeats=3, schema_version=1, precision="fp32", attrs=None):
    """Writes a bench file as src/bench/bench_common.cpp does. columns: name -> list; the
    common columns not given are filled in (status ok, times from time_median_s)."""
    points = len(next(iter(columns.values())))
    columns = dict(columns)
    columns.setdefault("status", ["ok"] * points)
    columns.setdefault("detail", [""] * points)
    median = np.asarray(columns["time_median_s"], dtype=float)
    columns.setdefault("time_q1_s", list(median * 0.9))
    columns.setdefault("time_q3_s", list(median * 1.1))
    columns.setdefault("calls_per_sample", [1] * points)
    with h5py.File(path, "w") as handle:
        for key, value in {"schema_version": np.int64(schema_version), "scalestudy_version": "0.1.0", "git_sha": "abc",
                           "argv": f"scalestudy bench {name}", "start_time": "2025-01-01T00:00:00Z",
                           "end_time": "2025-01-01T00:01:00Z", "world_size": np.int64(world_size),
                           "nodes": np.int64(1), "ranks_per_node": np.int64(world_size), "backend": "cpu",
                           "precision": precision, "status": status, "failure_reason": "" if status == "complete"
                           else "rank 0: it broke", "cuda_version": "none", "nccl_version": "none",
                           "mpi_version": "synthetic", "hdf5_version": "1.14.3", "bench": name}.items():
            handle.attrs[key] = value
        for key, value in (attrs or {}).items():
            handle.attrs[key] = value
        text = h5py.string_dtype()
        handle.create_dataset("ranks/hostname", data=np.array(["node"] * world_size, dtype=object), dtype=text)
        handle.create_dataset("ranks/device", data=np.array([device] * world_size, dtype=object), dtype=text)
        group = handle.create_group(f"bench/{name}")
        for key, value in (method or {"timing": "synthetic"}).items():
            group.attrs[key] = value
        for key, values in columns.items():
            if isinstance(values[0], str):
                group.create_dataset(key, data=np.array(values, dtype=object), dtype=text)
            else:
                group.create_dataset(key, data=np.asarray(values))
        group.create_dataset("samples_s", data=np.repeat(median[:, None], repeats, axis=1))


def gemm_columns(points):
    """points: (precision, n, seconds or a status)."""
    columns = {k: [] for k in ("precision", "n", "flops", "bytes", "arithmetic_intensity", "tflops", "status",
                               "time_median_s")}
    for precision, n, seconds in points:
        flops, size = 2.0 * n ** 3, 2 if precision in ("fp16", "bf16") else 4
        ok = not isinstance(seconds, str)
        columns["precision"].append(precision)
        columns["n"].append(n)
        columns["flops"].append(flops)
        columns["bytes"].append(3.0 * n * n * size)
        columns["arithmetic_intensity"].append(flops / (3.0 * n * n * size))
        columns["time_median_s"].append(seconds if ok else math.nan)
        columns["tflops"].append(flops / seconds / 1e12 if ok else math.nan)
        columns["status"].append("ok" if ok else seconds)
    return columns


def bandwidth_columns(points):
    """points: (kernel, elems, seconds)."""
    columns = {k: [] for k in ("kernel", "elems", "bytes", "flops", "arithmetic_intensity", "gb_per_s",
                               "time_median_s")}
    for kernel, elems, seconds in points:
        per_elem, flops = (12, 1.0) if kernel == "accumulate" else (8, 0.0)
        columns["kernel"].append(kernel)
        columns["elems"].append(elems)
        columns["bytes"].append(per_elem * elems)
        columns["flops"].append(flops * elems)
        columns["arithmetic_intensity"].append(flops / per_elem)
        columns["gb_per_s"].append(per_elem * elems / seconds / 1e9)
        columns["time_median_s"].append(seconds)
    return columns


def test_gemm_table_has_tflops_by_n_and_precision_with_unavailable_cells(tmp_path):
    path = tmp_path / "gemm.h5"
    write_bench(path, "gemm", gemm_columns([("fp32", 1024, 1e-3), ("tf32", 1024, "unavailable"),
                                            ("bf16", 1024, 1e-4), ("fp32", 2048, 8e-3)]))
    loaded = bench.read_bench_file(path)
    assert loaded.usable and loaded.problems == []
    (title, table), = bench.bench_tables(loaded)
    assert list(table.columns) == ["fp32", "tf32", "bf16"]
    assert table.loc[1024, "fp32"] == "2.147"     # 2·1024³ / 1 ms
    assert table.loc[1024, "bf16"] == "21.47"
    assert table.loc[1024, "tf32"] == "n/a"
    assert table.loc[2048, "fp32"] == "2.147"


def test_inference_grid_keeps_oom_cells_and_the_rates_are_recomputed(tmp_path):
    path = tmp_path / "inference.h5"
    batch, seq, seconds = [1, 1, 64, 64], [64, 4096, 64, 4096], [0.002, 0.01, 0.02, math.nan]
    flops = [1e12] * 4
    write_bench(path, "inference", {
        "batch": batch, "seq": seq, "flops": flops, "bytes": [1e9] * 4, "arithmetic_intensity": [1e3] * 4,
        "time_median_s": seconds, "latency_ms": [s * 1e3 for s in seconds],
        "sequences_per_s": [b / s for b, s in zip(batch, seconds)],
        "tokens_per_s": [b * t / s for b, t, s in zip(batch, seq, seconds)],
        "tflops": [f / s / 1e12 for f, s in zip(flops, seconds)], "memory_bytes": [1, 2, 3, 4],
        "status": ["ok", "ok", "ok", "oom"]})
    loaded = bench.read_bench_file(path)
    assert loaded.problems == []
    latency, throughput = (table for _, table in bench.bench_tables(loaded))
    assert latency.loc[64, 4096] == "OOM" and throughput.loc[64, 4096] == "OOM"
    assert latency.loc[1, 64] == "2" and throughput.loc[64, 64] == "3200"


def test_comm_busbw_follows_nccl_tests_and_a_wrong_rate_is_a_problem(tmp_path):
    assert bench.bus_factor("allreduce", 8) == 1.75 and bench.bus_factor("allgather", 4) == 0.75
    path = tmp_path / "comm.h5"
    gib, seconds = 1 << 30, 0.01
    algbw = gib / seconds / 1e9
    write_bench(path, "comm", {
        "collective": ["allreduce", "reduce_scatter"], "bytes": [gib, gib], "elems": [gib // 4] * 2,
        "time_median_s": [seconds, seconds], "algbw_gb_per_s": [algbw, algbw], "bus_factor": [1.0, 0.5],
        "busbw_gb_per_s": [algbw, algbw],  # the second should be algbw / 2
        "wrong_elems": [0, 0]}, world_size=2)
    loaded = bench.read_bench_file(path)
    assert [p.kind for p in loaded.problems] == ["rate mismatch"]
    points = loaded.points.set_index("collective")
    assert points.loc["allreduce", "busbw_gb_per_s"] == pytest.approx(107.374, rel=1e-4)
    assert points.loc["reduce_scatter", "busbw_gb_per_s"] == pytest.approx(algbw / 2)
    (_, table), = bench.bench_tables(loaded)
    assert table.loc["1 GiB", "reduce_scatter busbw"] == "53.69"
    assert table.loc["1 GiB", "wrong elements"] == "0"


def test_a_comm_file_names_its_link_and_meets_only_runs_of_its_emulation(tmp_path):
    def comm_file(name, busbw, attrs):
        path = tmp_path / name
        write_bench(path, "comm", {"collective": ["allreduce"], "bytes": [1 << 20], "elems": [1 << 18],
                                   "time_median_s": [(1 << 20) / busbw / 1e9], "algbw_gb_per_s": [busbw],
                                   "bus_factor": [1.0], "busbw_gb_per_s": [busbw], "wrong_elems": [0]},
                    world_size=2, schema_version=8, attrs={"backend": "cuda", **attrs})
        return bench.read_bench_file(path)
    nvlink = comm_file("nvlink.h5", 100.0, {"link_emulation": "none", "nccl_transports": "P2P"})
    socket = comm_file("socket.h5", 2.0, {"link_emulation": "socket", "nccl_transports": "NET/Socket"})
    old = comm_file("old.h5", 50.0, {})
    titles = [bench.bench_tables(b)[0][0] for b in (nvlink, socket, old)]
    assert titles == ["every rank: GB/s over 2 rank(s), link P2P, nccl-tests definitions",
                      "every rank: GB/s over 2 rank(s), link emulated inter-node (NET/Socket), nccl-tests "
                      "definitions",
                      "every rank: GB/s over 2 rank(s), link unknown, nccl-tests definitions"]
    # The bus bandwidth comes back through the file's time, to the last bit or so.
    assert nearest_bench([nvlink, socket], "allreduce", 2, 1 << 20, "socket") == (pytest.approx(2.0), 1 << 20)
    assert nearest_bench([nvlink, socket], "allreduce", 2, 1 << 20, "none") == (pytest.approx(100.0), 1 << 20)
    assert math.isnan(nearest_bench([socket], "allreduce", 2, 1 << 20, "none")[0]), \
        "no native file to set beside a native run"


def test_failed_files_and_other_files_are_problems_not_data(tmp_path):
    failed = tmp_path / "failed.h5"
    write_bench(failed, "gemm", gemm_columns([("fp32", 64, 1e-3)]), status="failed")
    run = tmp_path / "run.h5"
    write_run(run)
    for path, kind in ((failed, "failed"), (run, "unreadable")):
        loaded = bench.read_bench_file(path)
        assert not loaded.usable and [p.kind for p in loaded.problems] == [kind]


def comm_scope_columns(points):
    """points: (scope, ranks, groups, collective, bytes, seconds); rates as the binary
    writes them."""
    columns = {k: [] for k in ("scope", "ranks", "groups", "collective", "bytes", "elems", "time_median_s",
                               "algbw_gb_per_s", "bus_factor", "busbw_gb_per_s", "wrong_elems")}
    for scope, ranks, groups, collective, size, seconds in points:
        factor, algbw = bench.bus_factor(collective, ranks), size / seconds / 1e9
        for key, value in (("scope", scope), ("ranks", ranks), ("groups", groups), ("collective", collective),
                           ("bytes", size), ("elems", size // 4), ("time_median_s", seconds),
                           ("algbw_gb_per_s", algbw), ("bus_factor", factor),
                           ("busbw_gb_per_s", algbw * factor), ("wrong_elems", 0)):
            columns[key].append(value)
    return columns


def test_comm_scopes_get_their_own_bus_factor_tables_and_absences(tmp_path):
    # 2 nodes × 2 ranks: the world of 4, each node's 2 at once, and the 2 nodes' first ranks.
    mib, seconds = 1 << 20, 1e-3
    path = tmp_path / "comm.h5"
    write_bench(path, "comm", comm_scope_columns([
        ("world", 4, 1, "allreduce", mib, seconds), ("intra_node", 2, 2, "allreduce", mib, seconds / 4),
        ("inter_node", 2, 1, "allreduce", mib, seconds * 2)]), world_size=4, schema_version=8,
        method={"timing": "synthetic", "scopes": "world,intra_node,inter_node",
                "scope_world": "every rank: one communicator of 4 rank(s)",
                "scope_intra_node": "the ranks of each node: 2 communicator(s) of 2 rank(s)",
                "scope_inter_node": "each node's first rank: one communicator of 2 rank(s)"})
    loaded = bench.read_bench_file(path)
    # The bus factor of each scope is its own communicator's: a world factor (1.5) for the
    # 2-rank scopes would be a rate mismatch.
    assert loaded.usable and loaded.problems == []
    busbw = loaded.points.set_index("scope")["busbw_gb_per_s"]
    algbw = mib / seconds / 1e9
    assert busbw["world"] == pytest.approx(algbw * 1.5)
    assert busbw["intra_node"] == pytest.approx(algbw * 4 * 1.0)
    assert busbw["inter_node"] == pytest.approx(algbw / 2 * 1.0)
    titles = [title for title, _ in bench.bench_tables(loaded)]
    assert titles[1] == ("intra-node (the ranks of each node): GB/s over 2 rank(s), 2 at once, "
                         "link MPI (cpu backend), nccl-tests definitions")
    side_by_side = bench.bench_tables(loaded)[-1][1]
    assert list(side_by_side.columns) == ["allreduce world", "allreduce intra_node", "allreduce inter_node"]
    assert side_by_side.loc["1 MiB", "allreduce intra_node"] == f"{algbw * 4:.4g}"
    assert bench.comm_absent_lines(loaded) == []

    one_node = tmp_path / "one-node.h5"
    write_bench(one_node, "comm", comm_scope_columns([("world", 2, 1, "allgather", mib, seconds),
                                                      ("intra_node", 2, 1, "allgather", mib, seconds)]),
                world_size=2, schema_version=8,
                method={"timing": "synthetic", "scopes": "world,intra_node,inter_node",
                        "scope_inter_node": "absent: one node"})
    report, _ = bench.write_bench_report([one_node], tmp_path / "out")
    assert "- inter-node (one rank per node): absent: one node" in report
    assert "allgather inter_node" not in report, "an absent scope gets no column"


@pytest.mark.parametrize("version, usable", [(1, True), (2, True), (3, True), (4, True),
                                             (5, True), (6, True), (7, True), (8, True), (9, False)])
def test_bench_files_of_schema_1_to_8_are_read_and_others_are_named(tmp_path, version, usable):
    path = tmp_path / "gemm.h5"
    write_bench(path, "gemm", gemm_columns([("fp32", 64, 1e-3)]), schema_version=version)
    loaded = bench.read_bench_file(path)
    assert loaded.usable == usable
    assert [p.kind for p in loaded.problems] == ([] if usable else ["unreadable"])
    if not usable:
        assert f"schema_version {version}" in loaded.problems[0].message


def test_roofline_roofs_are_the_best_gemm_and_the_largest_size_bandwidth(tmp_path):
    write_bench(tmp_path / "gemm.h5", "gemm", gemm_columns([("fp32", 1024, 1e-3), ("bf16", 1024, 1e-4)]))
    write_bench(tmp_path / "bw.h5", "bandwidth", bandwidth_columns([
        ("copy", 1 << 14, 1e-7), ("copy", 1 << 24, 1e-3), ("accumulate", 1 << 24, 2e-3)]))
    benches = [bench.read_bench_file(tmp_path / name) for name in ("gemm.h5", "bw.h5")]
    (roofline,) = bench.build_rooflines(benches)
    assert roofline.peak_tflops == pytest.approx(2 * 1024 ** 3 / 1e-4 / 1e12)
    assert roofline.fp32_tflops == pytest.approx(2 * 1024 ** 3 / 1e-3 / 1e12)
    # 16M elements copied in 1 ms: 8 bytes each, 134 GB/s; the 16K copy is faster but small.
    assert roofline.bandwidth_gbs == pytest.approx(8 * (1 << 24) / 1e-3 / 1e9)
    assert roofline.roof(1e6) == pytest.approx(roofline.peak_tflops)
    assert roofline.roof(1.0) == pytest.approx(roofline.bandwidth_gbs / 1e3)
    groups = [p[0] for p in roofline.points]
    assert groups.count("gemm") == 2 and groups.count("elementwise") == 1
    intensity = [p[2] for p in roofline.points if p[0] == "elementwise"][0]
    assert intensity == pytest.approx(1 / 12)


def test_report_and_cli_write_tables_csvs_and_a_roofline_with_training_phases(tmp_path, capsys):
    write_bench(tmp_path / "gemm.h5", "gemm", gemm_columns([("fp32", 256, 1e-3)]))
    write_bench(tmp_path / "bw.h5", "bandwidth", bandwidth_columns([("accumulate", 1 << 20, 1e-3)]))
    runs = tmp_path / "runs"
    write_run(runs / "run.h5", config=base_config())
    out = tmp_path / "out"
    code = bench.main([str(tmp_path / "gemm.h5"), str(tmp_path / "bw.h5"), "-o", str(out), "--runs", str(runs)])
    assert code == 0
    # On success it says where the report is, once, and nothing else.
    assert capsys.readouterr().out == f"{out / 'bench-report.md'}\n"
    report = (out / "bench-report.md").read_text()
    assert "## gemm" in report and "## bandwidth" in report and "![roofline](roofline.png)" in report
    assert (out / "roofline.png").stat().st_size > 0 and (out / "bench-gemm.csv").exists()
    (roofline,) = bench.build_rooflines([bench.read_bench_file(tmp_path / "gemm.h5")], runs)
    forward = [p for p in roofline.points if p[0] == "training forward"]
    # synth's layout: forward is 30 % of a 0.1 s step; tiny-ish shape of base_config().
    flops = bench.forward_flops(2, 64, 256, 8, 64)
    assert forward[0][3] == pytest.approx(flops / 0.03 / 1e12)
    assert forward[0][2] == pytest.approx(flops / bench.gpt_forward_bytes(2, 64, 4, 256, 8, 64))
    assert bench.main([str(tmp_path / "missing.h5"), "-o", str(out)]) == bench.USAGE_ERROR
    assert bench.main([str(runs / "run.h5"), "-o", str(out)]) == bench.USAGE_ERROR


def test_byte_model_is_the_cpp_one_on_known_numbers():
    assert bench.matmul_forward_bytes(2, 3, 4, True) == 4.0 * 30
    assert bench.matmul_backward_bytes(2, 3, 4, True, True) == 4.0 * (8 + 6 + 12 + 12 + 24 + 8)
    assert bench.matmul_backward_bytes(2, 3, 4, True, False) == 4.0 * (8 + 6 + 12 + 6 + 24 + 8)
    one, two, three = (bench.gpt_forward_bytes(layers, 1024, 16, 30522, 4, 128) for layers in (1, 2, 3))
    assert three - two == pytest.approx(two - one)
    assert bench.gpt_backward_bytes(1, 32, 4, 64, 2, 8) > bench.gpt_forward_bytes(1, 32, 4, 64, 2, 8)


# ---- the inference grid and the layer roofline -------------------------------------------

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


# ---- real files from the binary --------------------------------------------------------------

needs_binary = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")
QUICK = ["--warmup", "1", "--repeats", "3", "--min-sample-ms", "0.2"]


@needs_binary
def test_real_cpu_bench_files_load_and_their_bytes_match_the_python_model(tmp_path):
    files = {}
    # Every precision named, so that the cpu marks the three it lacks as unavailable.
    for name, options in (("gemm", ["--sizes", "16,32", "--precisions", "fp32,tf32,fp16,bf16"]),
                          ("bandwidth", ["--sizes", "1K..8K"]),
                          ("layer", ["--batches", "1,2", "--seqs", "8,16"]),
                          ("inference", ["--batches", "1,3", "--seqs", "8"])):
        files[name] = tmp_path / f"{name}.h5"
        subprocess.run([BINARY, "bench", name, *options, *QUICK, "-o", str(files[name])], check=True,
                       capture_output=True, timeout=600)
    command = [BINARY, "bench", "comm", "--max-bytes", "8K", *QUICK, "-o", str(tmp_path / "comm.h5")]
    if MPIEXEC:
        command = [MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-np", "2"] + command
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    files["comm"] = tmp_path / "comm.h5"
    text, benches = bench.write_bench_report(list(files.values()), tmp_path / "out")
    assert all(b.usable for b in benches) and [p for b in benches for p in b.problems] == []
    assert (tmp_path / "out" / "roofline.png").exists()

    loaded = {b.name: b for b in benches}
    layer = loaded["layer"]
    shape = [int(layer.method[k]) for k in ("layers", "hidden", "heads", "vocab")]
    assert shape[0] == 1
    def model_work(layers, row):
        model = [layers, *shape[1:]]
        work = bench.gpt_forward_bytes(*model, row["batch"], row["seq"])
        flops = bench.forward_flops(layers, shape[1], shape[3], row["batch"], row["seq"])
        if row["pass"] == "forward+backward":
            work += bench.gpt_backward_bytes(*model, row["batch"], row["seq"])
            flops *= 3
        return work, flops

    for part, work in (("model-1-layer", lambda row: model_work(1, row)),
                       ("model-2-layers", lambda row: model_work(2, row)),
                       ("block", lambda row: np.subtract(model_work(2, row), model_work(1, row)))):
        rows = layer.points[layer.points["part"] == part].to_dict("records")
        assert len(rows) == 8, part  # 2 batches × 2 seqs × 2 passes
        for row in rows:
            expected_bytes, expected_flops = work(row)
            assert row["bytes"] == pytest.approx(expected_bytes, rel=1e-12), row
            assert row["flops"] == pytest.approx(expected_flops, rel=1e-12), row
    inference = loaded["inference"]
    shape = [int(inference.method[k]) for k in ("layers", "hidden", "heads", "vocab")]
    for row in inference.points.to_dict("records"):
        assert row["bytes"] == pytest.approx(bench.gpt_forward_bytes(*shape, row["batch"], row["seq"]), rel=1e-12)
    comm = loaded["comm"]
    assert (comm.points["wrong_elems"] == 0).all() and (comm.points["status"] == "ok").all()
    gemm = loaded["gemm"].points
    assert set(gemm[gemm["precision"] != "fp32"]["detail"]) == {"not available on cpu"}


@needs_binary
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
