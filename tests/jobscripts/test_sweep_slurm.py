"""The sweep on Slurm as a production cluster runs it, with stub srun, mpirun, sbatch,
sacct, scontrol and squeue: the start-up retry of a launch that ends before its run
created its result file, in the sbatch scripts and the local launcher; `sweep.py status`
and the resume that follows what Slurm says happened to each job; the report job's
predictions; the GEMM searches that run before the training points (gemm_search = on),
in their job and in the local launcher."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import sweep  # noqa: E402
import sweep_experiment  # noqa: E402
import sweep_local  # noqa: E402
import sweep_plan  # noqa: E402
import sweep_slurm  # noqa: E402
import sweep_status  # noqa: E402

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
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, ["gpus = 2"]))
    (point,) = sweep_plan.plan(experiment)
    script = tmp_path / "point.sbatch"
    script.write_text(sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy")))
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
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, ["gpus = 2"]))
    (point,) = sweep_plan.plan(experiment)
    point.result.parent.mkdir(parents=True)
    point.result.write_text("failed by the run before")
    script = tmp_path / "point.sbatch"
    script.write_text(sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy")))
    monkeypatch.setenv("STUB_MODE", "crash-once")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and launcher_stubs() == 2 and out.stdout.count(RETRY_LINE) == 1, out.stdout


@pytest.mark.parametrize("mode, starts, code, retried", RETRY_CASES)
def test_the_local_launcher_starts_a_launch_once_more_only_where_it_ended_before_the_result_file(
        tmp_path, monkeypatch, capsys, launcher_stubs, mode, starts, code, retried):
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, ["gpus = 2", "bench_comm = off"]))
    points = sweep_plan.plan(experiment)
    monkeypatch.setenv("STUB_MODE", mode)
    failures = sweep_local.run_local(experiment, points, Path("/opt/scalestudy"), "mpirun")
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


def submitted_labels(call):
    """The points an sbatch call submitted: the point of its script, or every point on the
    task list of a job array's script."""
    script = Path(call[-1])
    if not script.name.startswith("array-"):
        return [script.name[:-len(".sbatch")]]
    (tasks,) = [line.split("=", 1)[1] for line in script.read_text().splitlines() if line.startswith("tasks=")]
    return Path(tasks).read_text().split()


def a_sweep_whose_jobs_ended(tmp_path, capsys, arrays="off"):
    """A sweep of six training points and its bench comm point, submitted (as one job per
    point, or as job arrays, one for each of its two shapes); then two points complete,
    one cancelled, one timed out, one failed on bad input, one out of memory, and bench
    comm's job still running. Returns (experiment path, {label: job id})."""
    path = write_experiment(tmp_path, ["gpus = 1, 2", "repeats = 3", f"arrays = {arrays}"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    jobs = {label: entry["job"] for label, entry in manifest["points"].items()}
    units = 2 if arrays == "on" else 7
    assert len(jobs) == 7 and manifest["report"] == str(100 + units)
    if arrays == "on":
        # Task i of an array runs its group's point i: n1's three points, then n2's and bench comm.
        assert sorted(jobs.values()) == ["100_0", "100_1", "100_2", "101_0", "101_1", "101_2", "101_3"]
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
@pytest.mark.parametrize("arrays", ["off", "on"])
def test_status_shows_each_point_and_its_job_and_resume_reruns_only_the_cancelled_and_timed_out(
        tmp_path, monkeypatch, capsys, slurm_stubs, accounting, arrays):
    monkeypatch.setenv("STUB_ACCOUNTING", accounting)
    path, jobs = a_sweep_whose_jobs_ended(tmp_path, capsys, arrays)
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
    (report,) = [call for call in calls if call[-1].endswith("report.sbatch")]
    calls.remove(report)
    assert len(calls) == 2, "one job, or one array of one shape, for each point rerun"
    submitted = sorted(label for call in calls for label in submitted_labels(call))
    assert submitted == [f"{prefix}n1-r2", f"{prefix}n2-r0"], out
    new = ["108", "109"] if arrays == "off" else ["103", "104"]
    # The report runs after the new jobs and the one still running.
    (dependency,) = [word for word in report if word.startswith("--dependency=")]
    assert sorted(dependency.split(":")[1:]) == sorted(new + [jobs["bench-comm-n2"]])
    assert f"{prefix}n2-r1: not rerun, bad input (log: {BAD_INPUT})" in out
    assert f"{prefix}n2-r2: not rerun, out of memory (failure_reason: {OOM})" in out
    assert f"bench-comm-n2: job {jobs['bench-comm-n2']} is RUNNING; not submitted again" in out
    # The manifest now names the new jobs of the rerun points, and keeps the others'.
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    assert {manifest["points"][prefix + label]["job"] for label in ("n1-r2", "n2-r0")} == \
        set(new if arrays == "off" else [job + "_0" for job in new])
    assert manifest["points"][prefix + "n2-r1"]["job"] == jobs[prefix + "n2-r1"]


@needs_binary
def test_a_held_point_runs_again_once_its_script_changes(tmp_path, monkeypatch, capsys, slurm_stubs):
    monkeypatch.setenv("STUB_ACCOUNTING", "on")
    path, jobs = a_sweep_whose_jobs_ended(tmp_path, capsys)
    path.write_text(path.read_text().replace("steps = 3", "steps = 4"))
    before = len(sbatch_calls(slurm_stubs))
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    out = capsys.readouterr().out
    submitted = [label for call in sbatch_calls(slurm_stubs)[before:] for label in submitted_labels(call)]
    assert "strong-ddp-overlap_off-n2-r1" in submitted and "strong-ddp-overlap_off-n2-r2" in submitted
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
    experiment = sweep_experiment.read_experiment(path)
    assert experiment.network == str(NETWORK)
    script = sweep_slurm.report_script(experiment)
    assert f"--network {NETWORK} --out {out / 'prediction'}" in script
    (tmp_path / "report.sbatch").write_text(script)
    ran = subprocess.run(["bash", str(tmp_path / "report.sbatch")], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (out / "report" / "report.md").stat().st_size > 0
    assert (out / "prediction" / "prediction.md").stat().st_size > 0
    assert (out / "prediction" / "predictions.csv").stat().st_size > 0


def test_without_a_network_file_the_report_job_says_it_writes_no_predictions(tmp_path):
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, ["gpus = 1, 2"]))
    script = sweep_slurm.report_script(experiment)
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


# ---- job arrays --------------------------------------------------------------------------

ARRAY_SWEEP = ["gpus = 1..8", "ntasks_per_node = 4", "strategies = ddp, zero2", "repeats = 2"]
# (nodes, ranks per node) of each shape, and the points of it: n1, n2 and n4 on one node,
# n8 on two with bench comm.
SHAPES = {(1, 1): 4, (1, 2): 4, (1, 4): 4, (2, 4): 5}
@pytest.mark.parametrize("time_limit, expected", [("00:20:00", "02:15:00"), ("1:00:00", "03:00:00"),
                                                   ("1-00:00:00", "3-00:00:00")])
def test_the_search_job_has_the_longer_of_the_time_limit_and_45_minutes_a_search(tmp_path, time_limit, expected):
    path = write_experiment(tmp_path, SEARCHING + ["gpus = 1..4", "overlap = off, on", f"time_limit = {time_limit}"],
                            SEARCH_TRAIN)
    experiment = sweep_experiment.read_experiment(path)
    searches = sweep_plan.gemm_searches(experiment, sweep_plan.plan(experiment))
    assert len(searches) == 3
    text = sweep_slurm.gemm_search_script(experiment, searches, Path("/opt/scalestudy"))
    assert re.search(r"^#SBATCH --time=(.*)$", text, re.M).group(1) == expected


# A stub srun that writes down its arguments, and says so on its output (the point's log).
RECORDING_SRUN = 'printf "%s\\n" "$@" > "$STUB_DIR/srun.$$"\necho "srun ran $*"\n'


def run_array_task(script, job_id, task, env=None):
    environment = dict(os.environ, SLURM_ARRAY_JOB_ID=job_id, SLURM_ARRAY_TASK_ID=str(task), **(env or {}))
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, env=environment)


@needs_binary
def test_points_of_one_shape_run_as_one_job_array_with_the_throttle(tmp_path, capsys, slurm_stubs):
    path = write_experiment(tmp_path, ARRAY_SWEEP + ["array_throttle = 2"])
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 0
    assert ("with --launcher slurm --submit: 5 sbatch call(s): 4 job array(s) (4 point(s) on 1 node(s) x 1 rank(s), "
            "4 point(s) on 1 node(s) x 2 rank(s), 4 point(s) on 1 node(s) x 4 rank(s), 5 point(s) on 2 node(s) x "
            "4 rank(s), at most 2 task(s) of each at once) and the report") in capsys.readouterr().out
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    calls = sbatch_calls(slurm_stubs)
    assert len(calls) == 5 and calls[-1][-1].endswith("report.sbatch")
    make_stub(tmp_path / "slurm-bin", "srun", RECORDING_SRUN)
    experiment = sweep_experiment.read_experiment(path)
    points = {point.label(): point for point in sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)}
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())["points"]
    ran = set()
    for call in calls[:-1]:
        script, job_id = Path(call[-1]), str(100 + calls.index(call))
        text = script.read_text()
        labels = submitted_labels(call)
        nodes, per_node = sweep_slurm.shape_of(experiment, points[labels[0]])
        assert SHAPES[(nodes, per_node)] == len(labels)
        assert f"#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={per_node}\n" in text
        assert f"#SBATCH --array=0-{len(labels) - 1}%2\n" in text
        for task, label in enumerate(labels):
            assert sweep_slurm.shape_of(experiment, points[label]) == (nodes, per_node)
            assert manifest[label]["job"] == f"{job_id}_{task}"
            out = run_array_task(script, job_id, task)
            assert out.returncode == 0, out.stdout + out.stderr
            # The point's own log, as a job of its own would name it.
            log = tmp_path / "out" / "logs" / f"experiment-{label}-{job_id}_{task}.out"
            assert manifest[label]["log"] == str(log)
            assert f"--output {points[label].result} " in log.read_text()
            ran.add(label)
    assert ran == set(points), "every point runs once"
    launches = [path.read_text().splitlines() for path in slurm_stubs.glob("srun.*")]
    assert sorted(args[args.index("--output") + 1] for args in launches) == sorted(str(p.result) for p in points.values())


@needs_binary
def test_arrays_off_keeps_one_job_per_point(tmp_path, capsys, slurm_stubs):
    path = write_experiment(tmp_path, ARRAY_SWEEP + ["arrays = off"])
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 0
    assert "with --launcher slurm --submit: 18 sbatch call(s): one job per point (17) and the report" in \
        capsys.readouterr().out
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    calls = sbatch_calls(slurm_stubs)
    assert len(calls) == 18 and not list((tmp_path / "out" / "jobs").glob("array-*"))


@needs_binary
@pytest.mark.parametrize("arrays", ["on", "off"])
def test_the_dry_run_of_a_complete_sweep_counts_the_report_only(tmp_path, capsys, slurm_stubs, arrays):
    path = write_experiment(tmp_path, ["array_throttle = 1", f"arrays = {arrays}"])
    write_result(tmp_path / "out" / "strong" / "ddp-overlap_off" / "n1-r0.h5", "complete")
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 0
    out = capsys.readouterr().out
    assert "[complete]" in out
    assert "with --launcher slurm --submit: 1 sbatch call(s): the report only, no point to submit\n" in out


def test_an_array_task_starts_its_point_once_more_after_a_start_up_crash(tmp_path, monkeypatch, launcher_stubs):
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, ["gpus = 2"]))
    (point,) = sweep_plan.plan(experiment)
    jobs = tmp_path / "out" / "jobs"
    jobs.mkdir(parents=True)
    (tmp_path / "out" / "logs").mkdir()
    (jobs / f"{point.label()}.sbatch").write_text(sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy")))
    (jobs / "tasks.points").write_text(point.label() + "\n")
    script = jobs / "array.sbatch"
    shape = sweep_slurm.shape_of(experiment, point)
    script.write_text(sweep_slurm.array_script(experiment, shape, jobs / "tasks.points", 1))
    out = run_array_task(script, "300", 0, {"STUB_MODE": "crash-once"})
    assert out.returncode == 0 and launcher_stubs() == 2, out.stdout + out.stderr
    log = (tmp_path / "out" / "logs" / f"experiment-{point.label()}-300_0.out").read_text()
    assert log.count(RETRY_LINE) == 1, log
    # A task past the list's end runs nothing, and says so.
    out = run_array_task(script, "300", 1, {"STUB_MODE": "crash-once"})
    assert out.returncode == 1 and "array task 1: no point" in out.stderr and launcher_stubs() == 2


@pytest.mark.parametrize("line, fragment", [("array_throttle = two", "array_throttle = 'two' is not a whole number"),
                                            ("array_throttle = -1", "array_throttle"),
                                            ("arrays = sometimes", "arrays = 'sometimes': expected yes or no")])
def test_a_bad_array_key_exits_2_naming_it(tmp_path, capsys, line, fragment):
    path = write_experiment(tmp_path, ARRAY_SWEEP + [line])
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_the_help_lists_the_array_keys_with_their_defaults(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--help"])
    text = capsys.readouterr().out
    assert re.search(r"\n  arrays +default: on\n", text) and re.search(r"\n  array_throttle +default: 0 \(no limit\)\n",
                                                                          text), text


def test_sacct_gives_the_state_of_array_tasks_not_yet_started(tmp_path, monkeypatch, slurm_stubs):
    make_stub(tmp_path / "slurm-bin", "sacct", "cat <<'END'\n100_0|RUNNING|0:0\n100_0.batch|RUNNING|0:0\n"
                                              "100_[1-2%1]|PENDING|0:0\n101|TIMEOUT|0:0\nEND\n")
    states = sweep_status.job_states(["100_0", "100_1", "100_2", "101"])
    assert {job: state.state for job, state in states.items()} == \
        {"100_0": "RUNNING", "100_1": "PENDING", "100_2": "PENDING", "101": "TIMEOUT"}


@needs_binary
def test_array_tasks_run_nothing_but_the_launcher_whatever_the_values_or_the_task_list_hold(
        tmp_path, monkeypatch, slurm_stubs):
    canary = tmp_path / "canary"
    path = tmp_path / "experiment.ini"
    path.write_text(f"[sweep]\noutput_dir = {tmp_path}/out\ngpus = 1, 2\n[train]\nmodel = tiny\nglobal-batch = 8\n"
                    f"[env]\nNCCL_DEBUG = $(touch {canary}) `touch {canary}` ; touch {canary}\n")
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY, "--submit"]) == 0
    make_stub(tmp_path / "slurm-bin", "srun", RECORDING_SRUN)
    calls = sbatch_calls(slurm_stubs)[:-1]
    for call in calls:
        for task in range(len(submitted_labels(call))):
            assert run_array_task(call[-1], "500", task).returncode == 0
    assert len(list(slurm_stubs.glob("srun.*"))) == 3
    # A task list that holds anything but a point's label runs nothing.
    (tasks,) = (tmp_path / "out" / "jobs").glob("array-n2x1-*.points")
    tasks.write_text(f"x; touch {canary}\n")
    out = run_array_task(calls[-1][-1], "500", 0)
    assert out.returncode == 1 and "no point on its line" in out.stderr
    assert not canary.exists()


@pytest.mark.parametrize("log_text, job, expected", [
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM Killed.",
     sweep_status.JobState("FAILED", 137, 0), "out of memory (log: slurmstepd: error: Detected 1 oom_kill event"),
    ("", sweep_status.JobState("OUT_OF_MEMORY", 0, 125), "out of memory (job OUT_OF_MEMORY (exit 0, signal 125))"),
    ("", sweep_status.JobState("FAILED", 2, 0), "bad input (job FAILED (exit 2))"),
    ("scalestudy bench: error: --max-bytes 1Q: not a size", sweep_status.JobState("FAILED", 2, 0),
     "bad input (log: scalestudy bench: error: --max-bytes 1Q: not a size)"),
    ("srun: error: node3: task 1: Segmentation fault", sweep_status.JobState("FAILED", 139, 0), ""),
    ("", sweep_status.JobState("TIMEOUT", 0, 0), ""),
])
def test_a_failure_is_named_bad_input_or_out_of_memory_from_the_log_or_the_job(tmp_path, log_text, job, expected):
    log = tmp_path / "point.out"
    log.write_text(log_text + "\n")
    point = sweep_plan.Point("strong", "ddp", "off", 2, 0, tmp_path / "n2-r0.h5")
    reason = sweep_status.held_reason(point, job, log)
    assert (reason.startswith(expected) if expected else reason == ""), reason


# ---- the GEMM searches (gemm_search = on) ------------------------------------------------

SEARCHING = ["backend = cuda", "gemm_search = on"]
SEARCH_TRAIN = ("model = gpt2-small", "global-batch = 32", "precision = bf16", "seq = 256", "steps = 3")
# (micro-batch, reserve) of each search of a strong sweep of 1..4 GPUs at global batch 32
# with overlap off and on: a search with the lane of n2 and n4 also chooses for their
# overlap-off points.
STRONG_SEARCHES = [(8, 4), (16, 4), (32, 0)]


def searches_of(experiment, points):
    return [(search.micro_batch, search.reserve) for search in sweep_plan.gemm_searches(experiment, points)]


def searching_sweep(tmp_path, sweep_lines=(), train_lines=SEARCH_TRAIN):
    return sweep_experiment.read_experiment(write_experiment(tmp_path, SEARCHING + list(sweep_lines), train_lines))


@pytest.mark.parametrize("sweep_lines, train_lines, fragment", [
    (["backend = cpu", "gemm_search = on"], SEARCH_TRAIN, "gemm_search = on: needs backend = cuda"),
    (SEARCHING, ("model = gpt2-small", "global-batch = 8", "precision = fp32"),
     "gemm_search = on: needs a 16-bit [train] precision"),
    (SEARCHING, SEARCH_TRAIN + ("gemm-algos-file = /tmp/algos.txt",),
     "gemm_search = on: conflicts with [train] gemm-algos-file"),
    (SEARCHING, ("global-batch = 8",), "gemm_search = on: needs model in [train]"),
    (["backend = cuda", "gemm_search = maybe"], SEARCH_TRAIN, "gemm_search = 'maybe'"),
])
def test_gemm_search_where_it_cannot_run_exits_2_naming_the_key(tmp_path, capsys, sweep_lines, train_lines,
                                                                 fragment):
    path = write_experiment(tmp_path, sweep_lines, train_lines)
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("precision", [None, "auto", "bf16", "fp16"])
def test_gemm_search_is_taken_on_cuda_in_16_bits_and_is_off_by_default(tmp_path, precision):
    train = ("model = gpt2-small", "global-batch = 8") + ((f"precision = {precision}",) if precision else ())
    assert searching_sweep(tmp_path, train_lines=train).gemm_search
    assert not sweep_experiment.read_experiment(write_experiment(tmp_path, ["backend = cuda"], train)).gemm_search


def test_only_the_training_points_of_a_searching_sweep_read_its_choice_file(tmp_path):
    experiment = searching_sweep(tmp_path, ["gpus = 1, 2"])
    choice_file = str(tmp_path / "out" / "gemm-algos.txt")
    for point in sweep_plan.plan(experiment):
        args = sweep_plan.point_arguments(experiment, point)
        assert args[args.index("--gemm-algos-file") + 1] == choice_file
    (bench,) = sweep_plan.bench_comm_points(experiment)
    assert "--gemm-algos-file" not in sweep_plan.point_arguments(experiment, bench)
    unsearched = sweep_experiment.read_experiment(write_experiment(tmp_path, ["backend = cuda", "gpus = 1, 2"],
                                                                   SEARCH_TRAIN))
    for point in sweep_plan.plan(unsearched):
        assert "--gemm-algos-file" not in sweep_plan.point_arguments(unsearched, point)
    assert sweep_plan.gemm_searches(unsearched, sweep_plan.plan(unsearched)) == []


@pytest.mark.parametrize("sweep_lines, train_lines, expected", [
    (["gpus = 1..4", "overlap = off, on"], SEARCH_TRAIN, STRONG_SEARCHES),
    (["gpus = 1..4", "overlap = on, off"], SEARCH_TRAIN, STRONG_SEARCHES),
    (["gpus = 1..4", "overlap = off"], SEARCH_TRAIN, [(8, 0), (16, 0), (32, 0)]),
    # A lane of [train]'s CTAs, and micro-batches of the batch per rank over grad-accum.
    (["gpus = 1..4", "overlap = on", "strategies = ddp, zero2"],
     SEARCH_TRAIN + ("overlapped-ctas = 8", "grad-accum = 2"), [(4, 8), (8, 8), (16, 0)]),
    (["scaling = weak", "gpus = 1..8", "overlap = off, on"], ("model = gpt2-small", "batch-per-rank = 8"), [(8, 4)]),
    (["scaling = weak", "gpus = 1..8"], ("model = gpt2-small", "batch-per-rank = 8"), [(8, 0)]),
    (["scaling = strong, weak", "gpus = 1, 2", "overlap = on"], SEARCH_TRAIN + ("batch-per-rank = 4",),
     [(4, 4), (16, 4), (32, 0)]),
])
def test_a_sweep_searches_each_micro_batch_once_with_the_largest_lane_its_points_run_beside(
        tmp_path, sweep_lines, train_lines, expected):
    experiment = searching_sweep(tmp_path, sweep_lines, train_lines)
    points = sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)
    assert searches_of(experiment, points) == expected


def test_a_search_runs_the_points_model_and_precision(tmp_path):
    train = ("model = gpt2-small", "layers = 4", "hidden = 256", "heads = 4", "vocab = 50304", "precision = bf16",
             "attention-kernel = flash", "max-seq = 512", "global-batch = 32", "lr = 0.001")
    experiment = searching_sweep(tmp_path, ["gpus = 1, 2", "overlap = on"], train)
    first, second = sweep_plan.gemm_searches(experiment, sweep_plan.plan(experiment))
    choice_file = str(tmp_path / "out" / "gemm-algos.txt")
    # Without seq in [train], train's sequence is --max-seq.
    assert sweep_plan.gemm_search_arguments(experiment, first) == [
        "gemm-search", "--backend", "cuda", "--model", "gpt2-small", "--layers", "4", "--hidden", "256",
        "--heads", "4", "--vocab", "50304", "--precision", "bf16", "--attention-kernel", "flash", "--seq", "512", "--micro-batch", "16", "--reserve", "4",
        "--gemm-algos-file", choice_file]
    assert sweep_plan.gemm_search_arguments(experiment, second)[-4:] == ["--micro-batch", "32", "--gemm-algos-file", choice_file]


def test_only_the_micro_batches_of_the_points_to_run_are_searched(tmp_path, capsys):
    experiment = searching_sweep(tmp_path, ["gpus = 1..4", "overlap = off, on"])
    points = sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)
    for point in points:
        if isinstance(point, sweep_plan.Point) and point.ranks == 4:
            write_result(point.result, "complete")
    pending = sweep_plan.pending_points(points)
    assert searches_of(experiment, pending) == [(16, 4), (32, 0)]
    sweep_plan.print_plan(experiment, points)
    plan = capsys.readouterr().out
    assert f"before the training points, 2 GEMM search(es) into {tmp_path / 'out' / 'gemm-algos.txt'}:\n" in plan
    assert "    gemm-search-b16  micro-batch=16 reserve=4\n    gemm-search-b32  micro-batch=32 reserve=0\n" in plan
    for point in points:
        if isinstance(point, sweep_plan.Point):
            write_result(point.result, "complete")
    # Bench comm alone is still to run: no search.
    assert searches_of(experiment, sweep_plan.pending_points(points)) == []
    sweep_plan.print_plan(experiment, points)
    assert "  no GEMM search: every training point is complete\n" in capsys.readouterr().out


# A stub srun that writes down its arguments and fails with exit status 3 at its $STUB_FAIL_AT-th start.
COUNTING_SRUN = r'''
n=$(ls "$STUB_DIR" | grep -c '^srun\.' || true); n=$((n + 1))
printf "%s\n" "$@" > "$STUB_DIR/srun.$n"
[ "$n" = "$STUB_FAIL_AT" ] && exit 3
exit 0
'''


@pytest.mark.parametrize("fail_at, code, runs", [(0, 0, 3), (2, 3, 2)])
def test_the_search_job_runs_each_search_in_turn_and_ends_at_the_first_that_fails(
        tmp_path, monkeypatch, slurm_stubs, fail_at, code, runs):
    path = write_experiment(tmp_path, SEARCHING + ["gpus = 1..4", "overlap = off, on", "gpus_per_node = 4",
                                                   "partition = gpu", "account = lab", "time_limit = 00:20:00"],
                            SEARCH_TRAIN)
    path.write_text(path.read_text() + "[env]\nNCCL_DEBUG = INFO\n")
    experiment = sweep_experiment.read_experiment(path)
    searches = sweep_plan.gemm_searches(experiment, sweep_plan.plan(experiment))
    text = sweep_slurm.gemm_search_script(experiment, searches, Path("/opt/scalestudy"))
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", text, re.M))
    assert sbatch["job-name"] == "experiment-gemm-search" and sbatch["output"] == f"{tmp_path}/out/logs/%x-%j.out"
    assert (sbatch["nodes"], sbatch["ntasks-per-node"], sbatch["gpus-per-node"]) == ("1", "1", "1")
    assert (sbatch["partition"], sbatch["account"]) == ("gpu", "lab")
    assert sbatch["time"] == "02:15:00", "45 minutes a search, more than the sweep's time limit"
    assert "\n#SBATCH --exclusive\n" in text and "\nexport NCCL_DEBUG=INFO\n" in text
    launches = [line for line in text.splitlines() if line.startswith("srun ")]
    choice_file = tmp_path / "out" / "gemm-algos.txt"
    assert launches == [f"srun --mpi=pmix --ntasks=1 /opt/scalestudy gemm-search --backend cuda --model gpt2-small "
                        f"--precision bf16 --seq 256 --micro-batch {batch}" + (f" --reserve {reserve}" if reserve else "")
                        + f" --gemm-algos-file {choice_file}" for batch, reserve in STRONG_SEARCHES]
    make_stub(tmp_path / "slurm-bin", "srun", COUNTING_SRUN)
    monkeypatch.setenv("STUB_FAIL_AT", str(fail_at))
    script = tmp_path / "gemm-search.sbatch"
    script.write_text(text)
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == code, ran.stdout + ran.stderr
    calls = sorted(slurm_stubs.glob("srun.*"))
    assert len(calls) == runs
    batches = [args[args.index("--micro-batch") + 1] for args in (call.read_text().split() for call in calls)]
    assert batches == [str(batch) for batch, _ in STRONG_SEARCHES][:runs]
    assert ran.stdout.splitlines()[-1] == f"scalestudy: gemm-search-b{STRONG_SEARCHES[runs - 1][0]}: micro-batch " \
                                           f"{STRONG_SEARCHES[runs - 1][0]}, reserve {STRONG_SEARCHES[runs - 1][1]}"


def options_of(call):
    """(the script an sbatch call submitted, its options)."""
    return Path(call[-1]).name, call[1:-1]


AFTER_SEARCH = ["--dependency=afterok:100", "--kill-on-invalid-dep=yes"]


@pytest.mark.parametrize("arrays", ["on", "off"])
def test_submit_starts_the_training_jobs_only_once_the_searches_succeed(tmp_path, capsys, slurm_stubs, arrays):
    experiment = searching_sweep(tmp_path, ["gpus = 1..4", "overlap = off, on", f"arrays = {arrays}"])
    points = sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)
    assert sweep_slurm.write_slurm(experiment, points, Path("/opt/scalestudy"), True, "sweep.py --submit") == 0
    out = capsys.readouterr().out
    calls = [options_of(call) for call in sbatch_calls(slurm_stubs)]
    assert calls[0] == ("gemm-search.sbatch", []), "the searches' job first, after nothing"
    assert "submitted gemm-search.sbatch as job 100 (3 GEMM search(es))" in out
    *units, (report, report_options) = calls[1:]
    assert report == "report.sbatch" and len(units) == (3 if arrays == "on" else 7)
    for script, options in units:
        # Arrays hold training points (bench comm shares n4's); alone, bench comm waits for no search.
        assert options == ([] if script == "bench-comm-n4.sbatch" else AFTER_SEARCH), script
    (dependency,) = report_options
    assert dependency.startswith("--dependency=afterany:") and dependency.split(":")[1:] == \
        [str(job) for job in range(100, 100 + 1 + len(units))]
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    assert manifest["gemm_search"] == "100"
    assert (tmp_path / "out" / "jobs" / "gemm-search.sbatch").read_text().count("\nsrun ") == 3
    (tmp_path / "states").write_text("100|RUNNING|0:0\n")
    sweep_status.show_status(experiment, points)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  gemm-search ")]
    assert line.endswith(f"  {tmp_path / 'out' / 'gemm-algos.txt'} (absent)  [job 100 RUNNING]"), line


def test_the_dry_run_counts_the_search_job(tmp_path, capsys):
    experiment = searching_sweep(tmp_path, ["gpus = 1, 2"])
    points = sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)
    sweep_slurm.print_submissions(experiment, points, Path("/opt/scalestudy"))
    assert ("with --launcher slurm --submit: 4 sbatch call(s): the GEMM searches' job (2 search(es), before the "
            "training jobs), 2 job array(s)") in capsys.readouterr().out


def test_a_resume_searches_the_points_still_to_run_after_the_searches_still_running(
        tmp_path, monkeypatch, capsys, slurm_stubs):
    monkeypatch.setenv("STUB_ACCOUNTING", "on")
    experiment = searching_sweep(tmp_path, ["gpus = 1..4", "overlap = off, on", "arrays = off"])
    points = sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment)

    def submit_again(states):
        (tmp_path / "states").write_text("".join(f"{job}|{state}\n" for job, state in states.items()))
        before = len(sbatch_calls(slurm_stubs))
        assert sweep_slurm.write_slurm(experiment, points, Path("/opt/scalestudy"), True, "sweep.py --submit") == 0
        capsys.readouterr()
        return [options_of(call) for call in sbatch_calls(slurm_stubs)[before:]]

    submit_again({})
    manifest = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())
    cancelled = {entry["job"]: "CANCELLED by 1000|0:15" for entry in manifest["points"].values()}
    # The one-GPU points complete; the searches' job is still running.
    for point in points:
        if isinstance(point, sweep_plan.Point) and point.ranks == 1:
            write_result(point.result, "complete")
    calls = submit_again({**cancelled, "100": "RUNNING|0:0"})
    assert calls[0] == ("gemm-search.sbatch", ["--dependency=afterany:100"]), calls
    search = (tmp_path / "out" / "jobs" / "gemm-search.sbatch").read_text()
    assert " --micro-batch 8 --reserve 4 " in search and " --micro-batch 16 --reserve 4 " in search \
        and "--micro-batch 32" not in search
    new_search = str(100 + 1 + len(cancelled) + 1)
    for script, options in calls[1:-1]:
        if script != "bench-comm-n4.sbatch":
            assert options == [f"--dependency=afterok:{new_search}", "--kill-on-invalid-dep=yes"], script
    # Every training point complete: bench comm alone runs again, with no search.
    for point in points:
        if isinstance(point, sweep_plan.Point):
            write_result(point.result, "complete")
    bench = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())["points"]["bench-comm-n4"]["job"]
    calls = submit_again({bench: "CANCELLED by 1000|0:15"})
    bench = json.loads((tmp_path / "out" / "jobs" / "submitted.json").read_text())["points"]["bench-comm-n4"]["job"]
    assert calls == [("bench-comm-n4.sbatch", []), ("report.sbatch", [f"--dependency=afterany:{bench}"])], calls


# An Apptainer that writes down its arguments and how many point launches came before it,
# and exits $STUB_SEARCH_EXIT; with STUB_SEARCH_EXIT=hang it sleeps, its pid in $STUB_DIR/hung.
RECORDING_APPTAINER = r'''
n=$(ls "$STUB_DIR" | grep -c '^apptainer\.' || true); n=$((n + 1))
{ cat "$STUB_COUNT" 2>/dev/null || echo 0; printf "%s\n" "$@"; } > "$STUB_DIR/apptainer.$n"
if [ "$STUB_SEARCH_EXIT" = hang ]; then echo $$ > "$STUB_DIR/hung"; exec sleep 30; fi
exit "$STUB_SEARCH_EXIT"
'''


@pytest.fixture
def apptainer_sweep(tmp_path, monkeypatch, launcher_stubs, slurm_stubs):
    """A searching sweep in an Apptainer image, run with a stub apptainer (the searches)
    and the stub mpirun (the points): (experiment path, the apptainer calls, the points'
    launch count)."""
    make_stub(tmp_path / "bin", "apptainer", RECORDING_APPTAINER)
    path = write_experiment(tmp_path, SEARCHING + ["gpus = 1, 2", "overlap = on", "bench_comm = off",
                                                   "apptainer_image = /images/scalestudy.sif"], SEARCH_TRAIN)

    def apptainer_calls():
        return [call.read_text().splitlines() for call in sorted(slurm_stubs.glob("apptainer.*"))]
    return path, apptainer_calls, launcher_stubs


# The binary inside the image: not on this host, so the points are not checked here.
IMAGE_BINARY = "/opt/scalestudy/bin/scalestudy"


def test_a_local_sweep_runs_its_searches_one_after_the_other_before_any_point(
        tmp_path, monkeypatch, capsys, apptainer_sweep):
    path, apptainer_calls, point_launches = apptainer_sweep
    monkeypatch.setenv("STUB_SEARCH_EXIT", "0")
    assert sweep.main([str(path), "--binary", IMAGE_BINARY, "--no-report"]) == 1, "the stub mpirun runs no point"
    out = capsys.readouterr().out
    logs = tmp_path / "out" / "logs"
    assert "[search 1/2] gemm-search-b16 reserve=4 ... done in " in out and f"(log {logs}/gemm-search-b16.log)" in out
    assert "[search 2/2] gemm-search-b32 reserve=0 ... done in " in out
    first, second = apptainer_calls()
    assert first[0] == second[0] == "0", "no point launched before the searches"
    assert first[first.index(IMAGE_BINARY) + 1:] == [
        "gemm-search", "--backend", "cuda", "--model", "gpt2-small", "--precision", "bf16", "--seq", "256",
        "--micro-batch", "16", "--reserve", "4", "--gemm-algos-file", str(tmp_path / "out" / "gemm-algos.txt")]
    assert first[1:first.index(IMAGE_BINARY)][:2] == ["exec", "--nv"]
    assert (logs / "gemm-search-b32.log").read_text().startswith("apptainer exec --nv ")
    assert point_launches() == 2


def test_a_failing_search_stops_a_local_sweep_before_any_point(tmp_path, monkeypatch, capsys, apptainer_sweep):
    path, apptainer_calls, point_launches = apptainer_sweep
    monkeypatch.setenv("STUB_SEARCH_EXIT", "3")
    assert sweep.main([str(path), "--binary", IMAGE_BINARY]) == 1
    captured = capsys.readouterr()
    log = tmp_path / "out" / "logs" / "gemm-search-b16.log"
    assert "[search 1/2] gemm-search-b16 reserve=4 ... failed (exit 3) in " in captured.out
    assert captured.err == f"sweep: gemm-search-b16 failed (exit 3), so no training point ran; its log: {log}\n"
    assert len(apptainer_calls()) == 1 and point_launches() == 0
    assert not (tmp_path / "out" / "report").exists(), "no report after a failed search"


@needs_binary
def test_the_binary_refusing_a_search_stops_the_local_launcher(tmp_path, capsys, launcher_stubs):
    """The CPU build refuses gemm-search --backend cuda (exit 2) after taking every option
    the sweep gives it."""
    experiment = searching_sweep(tmp_path, ["gpus = 1, 2", "overlap = on", "bench_comm = off"],
                                 SEARCH_TRAIN + ("layers = 2", "hidden = 64", "heads = 4"))
    points = sweep_plan.plan(experiment)
    with pytest.raises(sweep_local.SearchFailed, match="gemm-search-b16 failed \\(exit 2\\)"):
        sweep_local.run_local(experiment, points, Path(BINARY), "mpirun")
    log = (tmp_path / "out" / "logs" / "gemm-search-b16.log").read_text()
    assert "--backend cuda: this build has no CUDA backend" in log and "unrecognised" not in log, log
    assert launcher_stubs() == 0 and not (tmp_path / "out" / "logs" / "gemm-search-b32.log").exists()


def test_sigint_during_a_search_stops_it_and_runs_no_point(tmp_path, monkeypatch, apptainer_sweep, slurm_stubs):
    path, _, point_launches = apptainer_sweep
    monkeypatch.setenv("STUB_SEARCH_EXIT", "hang")
    running = subprocess.Popen([sys.executable, str(ROOT / "jobscripts" / "sweep.py"), str(path), "--binary",
                                IMAGE_BINARY, "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hung = slurm_stubs / "hung"
    deadline = time.monotonic() + 30
    while not (hung.exists() and hung.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    search_pid = int(hung.read_text())
    running.send_signal(signal.SIGINT)
    _, stderr = running.communicate(timeout=30)
    assert running.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"sweep: stopped by SIGINT during gemm-search-b16: {tmp_path / 'out' / 'gemm-algos.txt'} keeps the choices "
        "it made; run the same command again to go on"), stderr
    assert not Path(f"/proc/{search_pid}").exists() or \
        Path(f"/proc/{search_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert point_launches() == 0
