"""The sweep on Slurm as a production cluster runs it, with stub srun, mpirun, sbatch,
sacct, scontrol and squeue: the start-up retry of a launch that ends before its run
created its result file, in the sbatch scripts and the local launcher; `sweep.py status`
and the resume that follows what Slurm says happened to each job; the report job's
predictions."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import sweep  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
needs_binary = pytest.mark.skipif(not BINARY, reason="needs SCALESTUDY_BINARY, the binary that checks each point")

RETRY_LINE = "before the run created its result file, as a crash inside MPI_Init does"


def write_experiment(tmp_path, sweep_lines, train_lines=("model = tiny", "global-batch = 8", "steps = 3")):
    path = tmp_path / "experiment.ini"
    path.write_text("[sweep]\n" + "\n".join([f"output_dir = {tmp_path}/out"] + list(sweep_lines))
                    + "\n[train]\n" + "\n".join(train_lines) + "\n")
    return path


def make_stub(bin_dir, name, body):
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / name
    stub.write_text("#!/bin/sh\n" + body)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return stub


# A launcher that counts its starts and, by $STUB_MODE: crashes as a rank in MPI_Init does
# the first time and completes the second (crash-once), crashes every time (crash-always),
# exits 2 as on bad input (bad-input), or creates the .partial and then fails (partial).
LAUNCHER = r'''
n=$(cat "$STUB_COUNT" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$STUB_COUNT"
out=""; previous=""
for word in "$@"; do [ "$previous" = "--output" ] && out=$word; previous=$word; done
case "$STUB_MODE" in
  crash-once)
    if [ "$n" -eq 1 ]; then echo "[node:1234] *** Process received signal *** (in MPI_Init)" >&2; exit 139; fi
    echo done > "$out"; exit 0 ;;
  crash-always) exit 139 ;;
  bad-input) echo "scalestudy train: error: --model nosuch: unknown model" >&2; exit 2 ;;
  partial) echo begun > "$out.partial"; exit 139 ;;
esac
'''


@pytest.fixture
def launcher_stubs(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    for name in ("srun", "mpirun"):
        make_stub(bin_dir, name, LAUNCHER)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    count = tmp_path / "starts"
    monkeypatch.setenv("STUB_COUNT", str(count))
    return lambda: int(count.read_text()) if count.exists() else 0


# (mode, starts, exit status, whether the log says the job was started once more)
RETRY_CASES = [("crash-once", 2, 0, True), ("crash-always", 2, 139, True), ("bad-input", 1, 2, False),
               ("partial", 1, 139, False)]


@pytest.mark.parametrize("mode, starts, code, retried", RETRY_CASES)
def test_an_sbatch_script_starts_a_launch_once_more_only_where_it_ended_before_the_result_file(
        tmp_path, monkeypatch, launcher_stubs, mode, starts, code, retried):
    experiment = sweep.read_experiment(write_experiment(tmp_path, ["gpus = 2"]))
    (point,) = sweep.plan(experiment)
    script = tmp_path / "point.sbatch"
    script.write_text(sweep.sbatch_script(experiment, point, Path("/opt/scalestudy")))
    monkeypatch.setenv("STUB_MODE", mode)
    # The job's output is the point's log (#SBATCH --output).
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == code, out.stdout + out.stderr
    assert launcher_stubs() == starts
    lines = [line for line in out.stdout.splitlines() if RETRY_LINE in line]
    assert len(lines) == (1 if retried else 0), out.stdout
    if retried:
        assert lines[0].startswith(f"scalestudy: {point.label()}: the launch ended with exit status 139: ")


def test_a_point_failed_before_is_started_once_more_while_its_old_file_stays_as_it_was(
        tmp_path, monkeypatch, launcher_stubs):
    """A rerun point's failed file from the run before is no file of this run: a crash
    before the run replaces it is retried."""
    experiment = sweep.read_experiment(write_experiment(tmp_path, ["gpus = 2"]))
    (point,) = sweep.plan(experiment)
    point.result.parent.mkdir(parents=True)
    point.result.write_text("failed by the run before")
    script = tmp_path / "point.sbatch"
    script.write_text(sweep.sbatch_script(experiment, point, Path("/opt/scalestudy")))
    monkeypatch.setenv("STUB_MODE", "crash-once")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and launcher_stubs() == 2 and out.stdout.count(RETRY_LINE) == 1, out.stdout


@pytest.mark.parametrize("mode, starts, code, retried", RETRY_CASES)
def test_the_local_launcher_starts_a_launch_once_more_only_where_it_ended_before_the_result_file(
        tmp_path, monkeypatch, capsys, launcher_stubs, mode, starts, code, retried):
    experiment = sweep.read_experiment(write_experiment(tmp_path, ["gpus = 2", "bench_comm = off"]))
    points = sweep.plan(experiment)
    monkeypatch.setenv("STUB_MODE", mode)
    failures = sweep.run_local(experiment, points, Path("/opt/scalestudy"), "mpirun")
    assert launcher_stubs() == starts
    # The stub writes no result file that reads back: every point is a failure.
    assert failures == points
    log = points[0].result.with_suffix(".log").read_text()
    lines = [line for line in log.splitlines() if RETRY_LINE in line]
    assert len(lines) == (1 if retried else 0), log
    if retried:
        assert lines[0].startswith(f"scalestudy: {points[0].label()}: the launch ended with exit status 139: ")
        # The log keeps both launches' output.
        assert log.count("mpirun ") == 2
