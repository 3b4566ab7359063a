"""Loading: what is used, what is left out, and that every exclusion is named; how runs
group into series, which never pool what differs (device, topology, backend, precision,
build (commit and dirty flag) and, on the CPU backend, CPU model and logical cores), with
the report listing what differs; and the files the C++ binary writes in this test run,
read back (skipped unless SCALESTUDY_BINARY points at it; tests/run-all.sh sets it)."""
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.report.cli import main
from scalestudy_analysis.results.load import load_results, read_run
from scalestudy_analysis.results.metrics import group_series
from scalestudy_analysis.results.schema import SCHEMA_VERSION
from synth import base_config, write_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"
H100 = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
BINARY = os.environ.get("SCALESTUDY_BINARY")
MPIEXEC = shutil.which("mpiexec")
needs_binary = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")


def kinds(problems):
    return sorted(problem.kind for problem in problems)


def test_complete_file_summary_agrees_with_the_reference(tmp_path):
    step_times = np.array([[0.3, 0.31], [0.2, 0.25], [0.21, 0.2], [0.26, 0.24], [0.22, 0.23]])
    path = write_run(tmp_path / "run.h5", world_size=2, steps=5, step_times=step_times,
                     peak=10.0, peak_source="datasheet: test", backend="cuda")
    run = read_run(path)
    assert run.usable and run.problems == []
    assert run.summary["steps_measured"] == 4
    assert run.summary["step_time_median_s"] == np.median([0.25, 0.21, 0.26, 0.23])


def test_tampered_summary_is_reported_and_the_run_left_out(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=2, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle["summary"].attrs["step_time_median_s"] = 0.2
    run = read_run(path)
    assert not run.usable
    assert kinds(run.problems) == ["summary mismatch"] and run.problems[0].excluded
    assert "step_time_median_s" in run.problems[0].message


def test_intervals_altered_in_place_are_refused(tmp_path):
    # The stored summary stays as written; the steps' intervals are stretched by 10 %, far
    # past the comparison's tolerance (schema.SUMMARY_RTOL).
    path = write_run(tmp_path / "run.h5", world_size=2, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle["steps/intervals"][...] = handle["steps/intervals"][...] * 1.1
    run = read_run(path)
    assert not run.usable
    assert kinds(run.problems) == ["summary mismatch"] and run.problems[0].excluded


def test_failed_and_partly_written_files_are_reported_and_excluded(tmp_path):
    write_run(tmp_path / "good.h5", world_size=2, step_times=0.1)
    write_run(tmp_path / "failed.h5", world_size=2, status="failed",
              failure_reason="rank 1 stuck in grad-comm")
    (tmp_path / "sub").mkdir()
    write_run(tmp_path / "sub" / "crashed.h5.partial", world_size=2, status="running", steps=3)
    write_run(tmp_path / "running.h5", world_size=2, status="running", steps=2)
    runs, frame, problems = load_results(tmp_path)
    assert len(runs) == 4 and len(frame) == 4
    assert kinds(problems) == ["failed", "incomplete", "incomplete"]
    by_file = {problem.where.rsplit("/", 1)[-1]: problem for problem in problems}
    assert "rank 1 stuck in grad-comm" in by_file["failed.h5"].message
    assert "3 steps recorded" in by_file["crashed.h5.partial"].message
    assert "running" in by_file["running.h5"].message
    assert all(problem.excluded for problem in problems)
    assert [run.path.endswith("good.h5") for run in runs if run.usable] == [True]
    series_list, _ = group_series(runs)
    assert [len(series.runs) for series in series_list] == [1]
    assert frame.set_index("path").loc["failed.h5", "included"] == False  # noqa: E712


def test_unreadable_and_incomplete_schema_files_are_named(tmp_path):
    (tmp_path / "garbage.h5").write_bytes(b"definitely not HDF5")
    path = write_run(tmp_path / "noloss.h5", world_size=1, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        del handle["steps/loss"]
    path = write_run(tmp_path / "v9.h5", world_size=1, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = np.int64(9)
    _, _, problems = load_results(tmp_path)
    messages = {problem.where.rsplit("/", 1)[-1]: problem for problem in problems}
    assert messages["garbage.h5"].kind == "unreadable"
    assert messages["noloss.h5"].kind == "missing field"
    assert "/steps/loss" in messages["noloss.h5"].message
    assert messages["v9.h5"].kind == "schema"
    assert all(problem.excluded for problem in problems)


def _corrupt_header(path, name):
    """Overwrites the first bytes of the object's header, as a second writer left the steps
    of a file marked complete: HDF5 then refuses the object ("bad object header version
    number") although the root still reads."""
    with h5py.File(path, "r") as handle:
        address = h5py.h5o.get_info(handle[name].id).addr
    with open(path, "r+b") as raw:
        raw.seek(address)
        raw.write(b"\x7f" * 4)


def test_a_complete_file_that_does_not_read_back_counts_as_failed_with_a_warning(tmp_path, capsys):
    for n in (1, 2):
        write_run(tmp_path / "results" / f"{n}.h5", world_size=n, step_times=0.1)
    corrupt = write_run(tmp_path / "results" / "corrupt.h5", world_size=2, step_times=0.1,
                        config=base_config(repeat=1))
    _corrupt_header(corrupt, "steps/intervals")
    run = read_run(corrupt)
    assert run.attrs["status"] == "complete" and run.status == "failed" and not run.usable
    assert "bad object header" in run.read_error
    assert [(p.kind, p.excluded) for p in run.problems] == [("unreadable", True)]
    warning = capsys.readouterr().err
    assert warning == (f"warning: {corrupt} does not read back ({run.read_error}); counted as "
                       "failed\n")

    assert main([str(tmp_path / "results"), "-o", str(tmp_path / "out")]) == 0
    assert f"warning: {corrupt} does not read back (" in capsys.readouterr().err
    runs = pd.read_csv(tmp_path / "out" / "runs.csv").set_index("path")
    assert runs.loc["corrupt.h5", "status"] == "failed"
    assert runs.loc["corrupt.h5", "included"] == False  # noqa: E712
    assert runs["included"].sum() == 2
    problems = (tmp_path / "out" / "report.md").read_text().split("## Problems", 1)[1]
    assert "corrupt.h5" in problems and "does not read back" in problems


def test_a_root_attribute_table_that_does_not_decode_is_named_not_a_traceback(tmp_path, capsys):
    path = write_run(tmp_path / "run.h5", world_size=1, step_times=0.1)
    _corrupt_header(path, "/")
    _, _, problems = load_results(tmp_path)
    assert [(p.kind, p.excluded) for p in problems] == [("unreadable", True)]
    assert f"warning: {path} does not read back (" in capsys.readouterr().err


def test_a_file_without_config_is_named_and_its_row_written(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=1, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        del handle["config"]
    _, frame, problems = load_results(tmp_path)
    assert [(p.kind, p.message) for p in problems] == [("missing field", "missing /config")]
    assert list(frame["included"]) == [False]


def test_collectives_naming_a_rank_outside_the_run_are_named(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=2, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle["collectives/rank"][0] = 211627975
    run = read_run(path)
    assert not run.usable
    assert [p.message for p in run.problems] == ["/collectives/rank holds 1 values outside [0, 2)"]


def test_mixed_git_sha_is_flagged_and_never_averaged(tmp_path):
    for n in (1, 2):
        write_run(tmp_path / f"old{n}.h5", world_size=n, step_times=0.2, git_sha="aaaa111")
    write_run(tmp_path / "new2.h5", world_size=2, step_times=0.1, git_sha="bbbb222",
              config=base_config(repeat=1))
    runs, _, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert kinds(problems) == ["mixed git_sha"]
    assert "aaaa111" in problems[0].message and "bbbb222" in problems[0].message
    assert sorted(len(series.runs) for series in series_list) == [1, 2]
    for series in series_list:
        assert len({run.git_sha for run in series.runs}) == 1


def test_mixed_config_is_flagged(tmp_path):
    write_run(tmp_path / "a.h5", world_size=1, step_times=0.2, config=base_config(hidden=64))
    write_run(tmp_path / "b.h5", world_size=2, step_times=0.1, config=base_config(hidden=128))
    runs, _, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert kinds(problems) == ["mixed config"]
    assert "hidden" in problems[0].message
    assert len(series_list) == 2


def test_repeats_and_batch_split_do_not_split_a_series(tmp_path):
    for n in (1, 2, 4):
        for repeat in (0, 1):
            write_run(tmp_path / f"n{n}r{repeat}.h5", world_size=n, step_times=0.1,
                      config=base_config(repeat=repeat, output=f"n{n}r{repeat}.h5",
                                         seed=repeat))
    runs, frame, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert problems == [] and len(series_list) == 1
    assert sorted(frame["batch_per_rank"].astype(int).unique()) == [2, 4, 8]
    assert all(len(times) == 5 for times in frame["step_times_s"])


def test_benchmark_files_are_not_runs(tmp_path):
    import h5py
    from scalestudy_analysis.results.load import find_result_files
    with h5py.File(tmp_path / "gemm.h5", "w") as handle:
        handle.attrs["bench"] = "gemm"
        handle.attrs["status"] = "complete"
    (tmp_path / "broken.h5").write_bytes(b"not hdf5")
    assert [p.name for p in find_result_files(tmp_path)] == ["broken.h5"]


def series_of(root):
    runs, _, _ = load_results(root)
    return group_series(runs)


def copy_as_h100(source, target):
    """The example's ddp files, the copy's /ranks/device and hostnames rewritten as if it
    had run on an H100 node."""
    shutil.copytree(source, target)
    for path in Path(target).rglob("*.h5"):
        with h5py.File(path, "r+") as handle:
            world_size = handle["ranks/device"].shape[0]
            for name, value in (("device", H100), ("hostname", "h100-node")):
                del handle[f"ranks/{name}"]
                handle.create_dataset(f"ranks/{name}", data=np.array([value] * world_size, dtype=object),
                                      dtype=h5py.string_dtype())


@pytest.fixture(scope="module")
def h100_and_h200(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(EXAMPLE / "strong" / "ddp-overlap_on", root / "h200" / "ddp")
    copy_as_h100(EXAMPLE / "strong" / "ddp-overlap_on", root / "h100" / "ddp")
    return root


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason=f"{EXAMPLE} is missing")
def test_an_h100_and_an_h200_set_are_two_series_and_the_report_names_the_device(h100_and_h200, tmp_path):
    series_list, problems = series_of(h100_and_h200)
    assert len(series_list) == 2
    devices = sorted(run.devices[0] for s in series_list for run in s.runs[:1])
    assert devices[0] == H100 and devices[1].startswith("NVIDIA H200")
    for series in series_list:
        assert len({run.devices[0] for run in series.runs}) == 1
        assert len(series.runs) == 9
    assert [p.kind for p in problems] == ["mixed device"]
    assert "device=" + H100 in problems[0].message
    assert main([str(h100_and_h200), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    apart = report.split("## What sets the series apart", 1)[1].split("\n## ", 1)[0]
    assert "**Differs between series:** device." in apart
    assert H100 in apart
    assert "**mixed device**" in report.split("## Problems", 1)[1]


@pytest.mark.parametrize("change, kind", [
    (dict(devices=["NVIDIA H100"] * 2), "mixed device"),
    (dict(git_sha="abc1234", git_dirty=1), "mixed git_sha"),
    (dict(git_sha="abc1234-dirty"), "mixed git_sha"),
    (dict(backend="cuda"), "mixed device"),
    (dict(cpu_model="Other CPU"), "mixed cpu_model"),
    (dict(logical_cores=4), "mixed logical_cores"),
])
def test_each_difference_makes_a_series_of_its_own(tmp_path, change, kind):
    for n in (1, 2):
        write_run(tmp_path / f"a{n}.h5", world_size=n, git_sha="abc1234", git_dirty=0,
                  devices=["NVIDIA H200"] * n if "devices" in change else None)
    changed = dict(change)
    if "devices" in changed:
        changed["devices"] = ["NVIDIA H100"] * 2
    write_run(tmp_path / "b2.h5", world_size=2, config=base_config(repeat=1),
              **{"git_sha": "abc1234", **changed})
    series_list, problems = series_of(tmp_path)
    assert sorted(len(s.runs) for s in series_list) == [1, 2]
    assert [p.kind for p in problems] == [kind]


def test_overlap_after_resolved_per_world_size_keeps_one_series_and_a_requested_one_splits(tmp_path):
    # --overlap-after auto bounds zero2's share by 1/N: what ran differs along the series.
    for n, resolved in ((1, 0.5), (2, 0.5), (4, 0.25)):
        config = base_config(strategy="zero2", overlap="on", overlap_after="auto",
                             overlap_after_resolved=resolved)
        write_run(tmp_path / "auto" / f"n{n}.h5", world_size=n, config=config)
    series_list, problems = series_of(tmp_path / "auto")
    assert [len(s.runs) for s in series_list] == [3] and problems == []
    # Another requested share is another configuration.
    write_run(tmp_path / "auto" / "n4-explicit.h5", world_size=4,
              config=base_config(strategy="zero2", overlap="on", overlap_after="0.1",
                                 overlap_after_resolved=0.1, repeat=1))
    series_list, problems = series_of(tmp_path / "auto")
    assert sorted(len(s.runs) for s in series_list) == [1, 3]
    assert [p.kind for p in problems] == ["mixed config"]


def test_a_dirty_flag_and_a_dirty_suffix_are_the_same_build(tmp_path):
    # GPU runs, so that the version 4 file's unknown CPU does not split them.
    write_run(tmp_path / "a.h5", world_size=1, git_sha="abc1234", git_dirty=1, backend="cuda")
    write_run(tmp_path / "b.h5", world_size=2, git_sha="abc1234-dirty", schema_version=4,
              backend="cuda")
    series_list, problems = series_of(tmp_path)
    assert len(series_list) == 1 and problems == []


def test_cpu_model_and_cores_do_not_split_gpu_runs(tmp_path):
    write_run(tmp_path / "a.h5", world_size=1, backend="cuda", cpu_model="one")
    write_run(tmp_path / "b.h5", world_size=2, backend="cuda", cpu_model="two", logical_cores=8)
    series_list, problems = series_of(tmp_path)
    assert len(series_list) == 1 and problems == []


def test_the_same_n_on_other_nodes_is_another_series_and_one_node_runs_join_both(tmp_path):
    # 8 ranks as 2 nodes × 4 and as 4 nodes × 2; the 1- and 2-rank runs on one node fit
    # both packings, and the 4-rank run on one node fits only the one of 4 per node.
    write_run(tmp_path / "n1.h5", world_size=1)
    write_run(tmp_path / "n2.h5", world_size=2)
    write_run(tmp_path / "n4.h5", world_size=4)
    write_run(tmp_path / "n8x4.h5", world_size=8, hostnames=[f"a{r // 4}" for r in range(8)])
    write_run(tmp_path / "n8x2.h5", world_size=8, config=base_config(repeat=1),
              hostnames=[f"b{r // 2}" for r in range(8)])
    series_list, problems = series_of(tmp_path)
    sizes = {s.variant["ranks per node"]: sorted(r.world_size for r in s.runs) for s in series_list}
    assert sizes == {"2": [1, 2, 8], "4": [1, 2, 4, 8]}
    assert [p.kind for p in problems] == ["mixed ranks per node"]


def test_a_version_4_file_reads_its_host_as_unknown_and_a_version_5_file_without_it_is_named(tmp_path):
    old = write_run(tmp_path / "v4.h5", world_size=1, schema_version=4)
    new = write_run(tmp_path / "v5.h5", world_size=1, config=base_config(repeat=1))
    with h5py.File(new, "r+") as handle:
        del handle["ranks/logical_cores"]
    runs, _, problems = load_results(tmp_path)
    by_name = {Path(run.path).name: run for run in runs}
    assert by_name["v4.h5"].logical_cores is None and by_name["v4.h5"].cpu_binding is None
    assert by_name["v5.h5"].logical_cores is None and by_name["v5.h5"].cpu_binding == ["0"]
    assert [(Path(p.where).name, p.kind, p.excluded) for p in problems] == \
        [("v5.h5", "missing field", False)]
    assert "/ranks/logical_cores" in problems[0].message
    assert str(old) != str(new)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason=f"{EXAMPLE} is missing")
def test_compare_puts_the_h100_set_beside_the_h200_set_with_intervals(h100_and_h200, tmp_path):
    out = tmp_path / "compare"
    assert main(["compare", str(h100_and_h200 / "h200"), str(h100_and_h200 / "h100"), "-o", str(out)]) == 0
    rows = pd.read_csv(out / "compare.csv")
    assert rows["N"].tolist() == [1, 2, 4]
    # The copies hold the same steps, so every ratio is 1 and its interval is about it.
    np.testing.assert_allclose(rows["throughput_ratio"], 1.0, rtol=1e-12)
    assert ((rows["throughput_ratio_ci_lo"] < 1) & (rows["throughput_ratio_ci_hi"] > 1)).all()
    assert rows["differs"].str.contains("device: NVIDIA H200").all()
    assert H100 in (out / "compare.md").read_text()


@needs_binary
def test_file_from_the_cpp_writer_loads_and_its_summary_agrees(tmp_path):
    output = tmp_path / "run.h5"
    subprocess.run([BINARY, "train", "--model", "tiny", "--steps", "6", "--warmup-steps", "1",
                    "--output", str(output)], check=True, timeout=600)
    run = read_run(output)
    assert run.problems == [], [problem.line() for problem in run.problems]
    assert run.usable and run.summary["steps_measured"] == 5


@needs_binary
@pytest.mark.skipif(not MPIEXEC, reason="mpiexec not found")
@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_two_rank_file_carries_every_field(tmp_path, strategy):
    output = tmp_path / f"{strategy}.h5"
    subprocess.run([MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-np", "2", BINARY, "train",
                    "--model", "tiny", "--steps", "5", "--warmup-steps", "1", "--strategy", strategy,
                    "--overlap", "on", "--bucket-mb", "0.02", "--flush-every", "2",
                    "--output", str(output)], check=True, timeout=600)
    assert not (tmp_path / f"{strategy}.h5.partial").exists()
    if shutil.which("h5dump"):
        subprocess.run(["h5dump", "-H", str(output)], check=True, capture_output=True, timeout=60)
    with h5py.File(output, "r") as handle:
        root = handle.attrs
        for key in ("schema_version", "scalestudy_version", "git_sha", "argv", "start_time", "end_time",
                    "world_size", "nodes", "ranks_per_node", "backend", "precision", "status",
                    "failure_reason", "cuda_version", "nccl_version", "mpi_version", "hdf5_version",
                    "memory_estimate_bytes", "memory_estimate_by_kind", "memory_available_bytes"):
            assert key in root, key
        assert root["memory_estimate_by_kind"].shape == (6,)
        assert root["memory_estimate_bytes"] == root["memory_estimate_by_kind"].sum() > 0
        assert root["status"] == "complete" and root["world_size"] == 2 and root["schema_version"] == SCHEMA_VERSION
        assert handle["config"].attrs["strategy"] == strategy
        assert handle["ranks/hostname"].shape == (2,) and handle["ranks/device"].shape == (2,)
        # mpiexec starts both ranks here: one node, as MPI's shared-memory split sees it.
        assert handle["ranks/node_index"][...].tolist() == [0, 0]
        assert handle["ranks/local_rank"][...].tolist() == [0, 1]
        assert root["nodes"] == 1 and root["ranks_per_node"] == 2
        for name in ("device_uuid", "device_pci_bus_id"):  # no GPU on the cpu backend
            assert handle[f"ranks/{name}"].asstr()[...].tolist() == ["", ""], name
        intervals = handle["steps/intervals"]
        assert intervals.shape == (5, 2, 7, 2) and intervals.attrs["units"] == "s"
        assert intervals.maxshape[0] is None
        steps = intervals[...]
        assert np.all(steps[:, :, 6, 0] == 0.0) and np.all(steps[:, :, 6, 1] > 0)
        assert np.all(np.isfinite(steps[:, :, 1:3, :]))  # forward and backward on every rank
        gather = steps[:, :, 5, :]
        assert np.all(np.isnan(gather)) if strategy == "ddp" else np.all(np.isfinite(gather[1:]))
        assert handle["steps/loss"].shape == (5,) and handle["steps/warmup"][...].tolist() == [1, 0, 0, 0, 0]
        # Nothing is traced on the CPU (--profile-kernels needs CUDA), so no /kernel_trace.
        assert handle["steps/traced"][...].tolist() == [0] * 5 and "kernel_trace" not in handle
        # The CPU backend has no GPU to sample: every rank's steps hold no samples.
        assert handle["config"].attrs["gpu_telemetry_ms"] == "0"
        assert handle["steps/gpu_samples"].shape == (5, 2) and not handle["steps/gpu_samples"][...].any()
        assert np.all(np.isnan(handle["steps/gpu_sm_clock_mhz"][...]))
        assert handle["steps/gpu_power_w"].attrs["units"] == "W"
        # Version 4's state by phase: [S, R, P], likewise without samples.
        phase_samples = handle["steps/gpu_phase_samples"]
        assert phase_samples.shape == (5, 2, 7) and phase_samples.dtype == np.int64
        assert not phase_samples[...].any()
        for name, units in (("gpu_phase_sm_clock_mhz", "MHz"), ("gpu_phase_power_w", "W")):
            assert handle[f"steps/{name}"].shape == (5, 2, 7) and handle[f"steps/{name}"].attrs["units"] == units
            assert np.all(np.isnan(handle[f"steps/{name}"][...])), name
        comm_bytes = handle["steps/comm_bytes"][...]
        assert comm_bytes.shape == (5, 5)
        main_kind = 0 if strategy == "ddp" else 1  # allreduce, or reduce_scatter
        assert np.all(comm_bytes[:, main_kind] > 0)
        for name in ("step", "rank", "kind", "phase", "begin", "end", "payload_bytes", "wait_begin",
                     "wait_end"):
            assert handle[f"collectives/{name}"].shape == handle["collectives/step"].shape
        assert set(handle["collectives/rank"][...].tolist()) == {0, 1}
        assert handle["memory/bytes"].shape == (2, 6) and np.all(handle["memory/peak_bytes"][...] > 0)
        summary = handle["summary"].attrs
        assert summary["steps_measured"] == 4 and summary["tokens_per_s"] > 0
        # The CPU's peak is measured at start-up with the backend's own matmul.
        assert summary["peak_source"].startswith("measured:") and summary["peak_tflops_per_gpu"] > 0
        assert summary["mfu"] == pytest.approx(summary["tflops_per_gpu"] / summary["peak_tflops_per_gpu"])
    run = read_run(output)
    assert run.problems == [], [problem.line() for problem in run.problems]
