"""The sweep on Slurm as a production cluster runs it, with stub srun, mpirun, sbatch,
sacct, scontrol and squeue: the start-up retry of a launch that ends before its run
created its result file, in the sbatch scripts and the local launcher; `sweep.py status`
and the resume that follows what Slurm says happened to each job; the report job's
predictions."""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
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
