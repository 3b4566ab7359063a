"""The sweep on Slurm as a production cluster runs it, with stub srun, mpirun, sbatch,
sacct, scontrol and squeue: the start-up retry of a launch that ends before its run
created its result file, in the sbatch scripts and the local launcher; `sweep.py status`
and the resume that follows what Slurm says happened to each job; the report job's
predictions."""
import json
import os
import shutil
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


# ---- status and resume by what Slurm says happened -------------------------------------

# Stub Slurm clients. sbatch numbers its jobs from 100, writing down each call; sacct,
# scontrol and squeue answer from $STUB_STATES, lines of JOBID|STATE|EXITCODE, as a cluster
# with job accounting does, or (STUB_ACCOUNTING=off) as one without: sacct refuses, and
# scontrol still knows the jobs that ended a short while ago.
SLURM_STUBS = {
    "sbatch": r'''
n=$(cat "$STUB_DIR/next" 2>/dev/null || echo 100); echo $((n + 1)) > "$STUB_DIR/next"
printf "%s\n" "$@" > "$STUB_DIR/sbatch.$n"
echo "$n;cluster"
''',
    "sacct": r'''
if [ "$STUB_ACCOUNTING" = off ]; then echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1; fi
ids=""; previous=""
for word in "$@"; do [ "$previous" = "-j" ] && ids=$word; previous=$word; done
for id in $(echo "$ids" | tr ',' ' '); do
  line=$(grep "^$id|" "$STUB_STATES") || continue
  echo "$line"
  echo "$id.batch|$(echo "$line" | cut -d'|' -f2 | cut -d' ' -f1)|$(echo "$line" | cut -d'|' -f3)"
done
''',
    "scontrol": r'''
[ "$1 $2" = "show job" ] || exit 1
line=$(grep "^$3|" "$STUB_STATES") || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
echo "JobId=$3 JobName=point"
echo "   JobState=$(echo "$line" | cut -d'|' -f2 | cut -d' ' -f1) Reason=None Dependency=(null)"
echo "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=$(echo "$line" | cut -d'|' -f3)"
''',
    "squeue": "exit 0\n",
}


@pytest.fixture
def slurm_stubs(tmp_path, monkeypatch):
    bin_dir, stub_dir = tmp_path / "slurm-bin", tmp_path / "slurm-calls"
    stub_dir.mkdir()
    for name, body in SLURM_STUBS.items():
        make_stub(bin_dir, name, body)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_DIR", str(stub_dir))
    monkeypatch.setenv("STUB_STATES", str(tmp_path / "states"))
    return stub_dir


def sbatch_calls(stub_dir):
    return [path.read_text().splitlines() for path in sorted(stub_dir.glob("sbatch.*"))]


def write_result(path, status, reason=""):
    h5py = pytest.importorskip("h5py")
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        handle.attrs["status"] = status
        handle.attrs["failure_reason"] = reason
        handle.create_dataset("steps/loss", data=[1.0, 0.5])


TIMED_OUT = "terminated by SIGTERM (time limit, scancel or kill)"
BAD_INPUT = "scalestudy train: error: --data /nowhere: must be random, markov or file"
OOM = "out of memory while allocating activations (1.2 GiB asked, 0.3 GiB free)"


def a_sweep_whose_jobs_ended(tmp_path, capsys):
    """A sweep of six training points and its bench comm point, submitted; then two points
    complete, one cancelled, one timed out, one failed on bad input, one out of memory, and
    bench comm's job still running. Returns (experiment path, {label: job id})."""
    path = write_experiment(tmp_path, ["gpus = 1, 2", "repeats = 3"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    jobs = {label: entry["job"] for label, entry in manifest["points"].items()}
    assert len(jobs) == 7 and manifest["report"] == "107"
    out, prefix = tmp_path / "out", "strong-ddp-overlap_off-"
    results = {label: out / "strong" / "ddp-overlap_off" / f"{label[len(prefix):]}.h5"
               for label in jobs if label.startswith(prefix)}
    write_result(results[prefix + "n1-r0"], "complete")
    write_result(results[prefix + "n1-r1"], "complete")
    Path(str(results[prefix + "n1-r2"]) + ".partial").write_text("")  # cancelled while it ran
    write_result(results[prefix + "n2-r0"], "failed", TIMED_OUT)
    Path(manifest["points"][prefix + "n2-r1"]["log"]).write_text(BAD_INPUT + "\n")
    write_result(results[prefix + "n2-r2"], "failed", OOM)
    states = {"n1-r0": "COMPLETED|0:0", "n1-r1": "COMPLETED|0:0", "n1-r2": "CANCELLED by 1000|0:15",
              "n2-r0": "TIMEOUT|0:0", "n2-r1": "FAILED|2:0", "n2-r2": "FAILED|1:0"}
    lines = [f"{jobs[prefix + key]}|{value}" for key, value in states.items()]
    lines.append(f"{jobs['bench-comm-n2']}|RUNNING|0:0")
    (tmp_path / "states").write_text("\n".join(lines) + "\n")
    return path, jobs


@needs_binary
@pytest.mark.parametrize("accounting", ["on", "off"])
def test_status_shows_each_point_and_its_job_and_resume_reruns_only_the_cancelled_and_timed_out(
        tmp_path, monkeypatch, capsys, slurm_stubs, accounting):
    monkeypatch.setenv("STUB_ACCOUNTING", accounting)
    path, jobs = a_sweep_whose_jobs_ended(tmp_path, capsys)
    assert sweep.main(["status", str(path)]) == 0
    shown = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    prefix = "strong-ddp-overlap_off-"

    def line(label):
        return shown[label]

    for label in ("n1-r0", "n1-r1"):
        assert f"  complete  [job {jobs[prefix + label]} COMPLETED (exit 0)]  resume: done" in line(prefix + label)
    assert "running (.partial)" in line(prefix + "n1-r2") and "CANCELLED" in line(prefix + "n1-r2")
    assert "resume: rerun" in line(prefix + "n1-r2")
    assert f"failed: {TIMED_OUT}" in line(prefix + "n2-r0") and "TIMEOUT" in line(prefix + "n2-r0")
    assert "resume: rerun" in line(prefix + "n2-r0")
    assert "absent" in line(prefix + "n2-r1") and "FAILED (exit 2)" in line(prefix + "n2-r1")
    assert f"resume: not rerun (bad input (log: {BAD_INPUT}))" in line(prefix + "n2-r1")
    assert f"failed: {OOM}" in line(prefix + "n2-r2") and f"resume: not rerun (out of memory (failure_reason: {OOM}))" in \
        line(prefix + "n2-r2")
    assert f"absent  [job {jobs['bench-comm-n2']} RUNNING]" in line("bench-comm-n2")
    assert "resume: waiting" in line("bench-comm-n2")
    assert "report" in shown

    before = len(sbatch_calls(slurm_stubs))
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    out = capsys.readouterr().out
    calls = sbatch_calls(slurm_stubs)[before:]
    submitted = sorted(Path(call[-1]).name for call in calls)
    assert submitted == sorted([f"{prefix}n1-r2.sbatch", f"{prefix}n2-r0.sbatch", "report.sbatch"]), out
    # The report runs after the new jobs and the one still running.
    (report,) = [call for call in calls if call[-1].endswith("report.sbatch")]
    (dependency,) = [word for word in report if word.startswith("--dependency=")]
    assert sorted(dependency.split(":")[1:]) == sorted(["108", "109", jobs["bench-comm-n2"]])
    assert f"{prefix}n2-r1: not rerun, bad input (log: {BAD_INPUT})" in out
    assert f"{prefix}n2-r2: not rerun, out of memory (failure_reason: {OOM})" in out
    assert f"bench-comm-n2: job {jobs['bench-comm-n2']} is RUNNING; not submitted again" in out
    # The manifest now names the new jobs of the rerun points, and keeps the others'.
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    assert {manifest["points"][prefix + label]["job"] for label in ("n1-r2", "n2-r0")} == {"108", "109"}
    assert manifest["points"][prefix + "n2-r1"]["job"] == jobs[prefix + "n2-r1"]


@needs_binary
def test_a_held_point_runs_again_once_its_script_changes(tmp_path, monkeypatch, capsys, slurm_stubs):
    monkeypatch.setenv("STUB_ACCOUNTING", "on")
    path, jobs = a_sweep_whose_jobs_ended(tmp_path, capsys)
    path.write_text(path.read_text().replace("steps = 3", "steps = 4"))
    before = len(sbatch_calls(slurm_stubs))
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    out = capsys.readouterr().out
    submitted = sorted(Path(call[-1]).name for call in sbatch_calls(slurm_stubs)[before:])
    assert "strong-ddp-overlap_off-n2-r1.sbatch" in submitted and "strong-ddp-overlap_off-n2-r2.sbatch" in submitted
    assert "its script has changed since" in out


def test_status_of_a_sweep_never_submitted_lists_every_point_absent(tmp_path, capsys, slurm_stubs):
    path = write_experiment(tmp_path, ["gpus = 1, 2"])
    assert sweep.main(["status", str(path), "--output-dir", str(tmp_path / "elsewhere")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(lines) == 3 and all("absent  [not submitted]" in line for line in lines), lines


# ---- the report job writes the predictions ---------------------------------------------

NETWORK = ROOT / "experiments" / "networks" / "ib-ndr-400.ini"


def test_the_report_job_writes_the_report_and_the_predictions_beside_it(tmp_path):
    """The report job of an experiment that names its network, run on two repeats of the
    example dataset's DDP runs as a finished sweep's results."""
    out = tmp_path / "out"
    (out / "strong" / "ddp-overlap_on").mkdir(parents=True)
    for run in ("n1-r0", "n1-r1", "n2-r0", "n2-r1", "n4-r0", "n4-r1"):
        shutil.copy(ROOT / "examples" / "gpt2-small-strong-4xh200" / "strong" / "ddp-overlap_on" / f"{run}.h5",
                    out / "strong" / "ddp-overlap_on")
    path = write_experiment(tmp_path, ["gpus = 1, 2, 4", "network = experiments/networks/ib-ndr-400.ini"])
    experiment = sweep.read_experiment(path)
    assert experiment.network == str(NETWORK)
    script = sweep.report_script(experiment)
    assert f"--network {NETWORK} --out {out / 'prediction'}" in script
    (tmp_path / "report.sbatch").write_text(script)
    ran = subprocess.run(["bash", str(tmp_path / "report.sbatch")], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (out / "report" / "report.md").stat().st_size > 0
    assert (out / "prediction" / "prediction.md").stat().st_size > 0
    assert (out / "prediction" / "predictions.csv").stat().st_size > 0


def test_without_a_network_file_the_report_job_says_it_writes_no_predictions(tmp_path):
    experiment = sweep.read_experiment(write_experiment(tmp_path, ["gpus = 1, 2"]))
    script = sweep.report_script(experiment)
    assert "scalestudy_analysis.predict" not in script
    (line,) = [line for line in script.splitlines() if "no predictions" in line]
    said = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout
    assert said == "scalestudy: no predictions: the experiment names no network file (network = FILE in [sweep], " \
                   "e.g. experiments/networks/ib-ndr-400.ini)\n"
    # The report's exit status is the job's: a failed report fails the job.
    assert script.rstrip().endswith('exit "$status"') and " || status=$?" in script


@pytest.mark.parametrize("value, fragment", [("experiments/networks/nowhere.ini", "no such file"),
                                             ("net;touch x", "a path of letters")])
def test_a_bad_network_file_exits_2_naming_the_key(tmp_path, capsys, value, fragment):
    path = write_experiment(tmp_path, ["gpus = 1, 2", f"network = {value}"])
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "network = " in err and fragment in err and err.count("\n") == 1, err
