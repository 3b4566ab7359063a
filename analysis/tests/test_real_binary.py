"""Reads files written by the C++ binary in this test run. Skipped unless
SCALESTUDY_BINARY points at it (tests/run-all.sh sets it)."""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from scalestudy_analysis.load import read_run
from scalestudy_analysis.schema import SCHEMA_VERSION

BINARY = os.environ.get("SCALESTUDY_BINARY")
MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")


def test_file_from_the_cpp_writer_loads_and_its_summary_agrees(tmp_path):
    output = tmp_path / "run.h5"
    subprocess.run([BINARY, "train", "--model", "tiny", "--steps", "6", "--warmup-steps", "1",
                    "--output", str(output)], check=True, timeout=600)
    run = read_run(output)
    assert run.problems == [], [problem.line() for problem in run.problems]
    assert run.usable and run.summary["steps_measured"] == 5


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
