"""What Slurm says became of a sweep's jobs: their states (sacct, else scontrol or
squeue), the manifest of submitted jobs (jobs/submitted.json), the verdict on each point
(complete, waiting for its job, held on bad input or out of memory, or rerun), the status
command's listing, and the resume's decisions."""
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from script_cli import USAGE_ERROR, UsageError
from sweep_plan import gemm_algos_file, result_state, result_status


# jobs/<MANIFEST>: which Slurm job runs which point, written at each submission.
MANIFEST = "submitted.json"
# A job Slurm has not finished with: its point is not submitted again.
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                 "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
# A job that ended before its run completed, for a reason not its own: its point runs again.
RERUN_STATES = {"TIMEOUT", "PREEMPTED", "NODE_FAIL", "CANCELLED", "BOOT_FAIL", "DEADLINE"}
# What a result file's failure_reason or a point's log says of a failure that the same
# script meets again: bad input (the binary's usage errors, exit status 2), or memory.
BAD_INPUT = re.compile(r"usage error|bad input|scalestudy(?: [a-z]+)*: error: .*", re.I)
OUT_OF_MEMORY = re.compile(r".*(out of memory|out_of_memory|oom[-_ ]kill|std::bad_alloc|cannot allocate memory).*",
                           re.I)
# sacct's answer where the cluster keeps no job accounting.
NO_ACCOUNTING = re.compile(r"accounting storage is disabled|accounting is disabled|accounting_storage/none"
                           r"|no accounting", re.I)


@dataclass(frozen=True)
class JobState:
    state: str  # Slurm's state (CANCELLED, TIMEOUT, COMPLETED, ...), or "UNKNOWN"
    exit_status: object = None  # the batch script's exit status, None where Slurm gave none
    signal: int = 0  # the signal that ended it, 0 for none
    source: str = ""  # sacct, scontrol or squeue; "" where none answered

    def text(self):
        ended = self.exit_status is not None and self.state not in ACTIVE_STATES
        exit_text = f" (exit {self.exit_status}" if ended else ""
        if exit_text:
            exit_text += f", signal {self.signal})" if self.signal else ")"
        return f"{self.state}{exit_text}"


def slurm_command(command):
    """The answer of a Slurm client, or None where it is not on PATH or does not answer."""
    program = shutil.which(command[0])
    if not program:
        return None
    try:
        return subprocess.run([program] + command[1:], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def exit_code_of(text):
    """Slurm's ExitCode, "STATUS:SIGNAL": (status, signal), or (None, 0)."""
    match = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else (None, 0)


def sacct_states(ids):
    """The states sacct gives the jobs `ids` (the job's own line, not its steps'); None
    where there is no sacct or no accounting (sacct fails, or says so)."""
    out = slurm_command(["sacct", "-j", ",".join(ids), "--format=JobID,State,ExitCode", "--parsable2",
                         "--noheader"])
    if out is None or out.returncode != 0 or NO_ACCOUNTING.search(out.stdout + out.stderr):
        return None
    states = {}
    for line in out.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3:
            continue
        status, signum = exit_code_of(fields[2])
        state = JobState(fields[1].split()[0] if fields[1].split() else "UNKNOWN", status, signum, "sacct")
        for job_id in array_task_ids(fields[0]):
            if job_id in ids:
                states[job_id] = state
    return states


def array_task_ids(job_id):
    """The job ids a line of sacct names: itself, or where it lists an array's tasks not
    yet started (123_[0-7%2], 123_[1,4-5]), each task's id (123_0, ...)."""
    match = re.fullmatch(r"(\d+)_\[([\d,-]+)(?:%\d+)?\]", job_id)
    if not match:
        return [job_id]
    found = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            found += [f"{match.group(1)}_{task}" for task in range(int(low), int(high or low) + 1)]
    return found


def scontrol_state(job_id):
    """The state `scontrol show job` gives one job (it forgets a job some minutes after it
    ends), or None."""
    out = slurm_command(["scontrol", "show", "job", job_id])
    if out is None or out.returncode != 0:
        return None
    state = re.search(r"\bJobState=(\S+)", out.stdout)
    if not state:
        return None
    exit_code = re.search(r"\bExitCode=(\S+)", out.stdout)
    status, signum = exit_code_of(exit_code.group(1) if exit_code else "")
    return JobState(state.group(1), status, signum, "scontrol")


def squeue_state(job_id):
    """The state squeue gives a job it still lists, or None."""
    out = slurm_command(["squeue", "--noheader", "--jobs", job_id, "--format=%T"])
    if out is None or out.returncode != 0 or not out.stdout.split():
        return None
    return JobState(out.stdout.split()[0], None, 0, "squeue")


def job_states(ids):
    """{job id: JobState} for every id: from sacct, and where accounting is off (or sacct
    does not know a job yet) from scontrol, else squeue; UNKNOWN where none knows it."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    states = sacct_states(ids) or {}
    for job_id in ids:
        if job_id not in states:
            states[job_id] = scontrol_state(job_id) or squeue_state(job_id) or JobState("UNKNOWN")
    return states


def manifest_path(sweep):
    return sweep.output_dir / "jobs" / MANIFEST


def read_manifest(sweep):
    """The manifest of the sweep's submitted jobs: {"points": {label: {"job", "log",
    "script_sha256"}}, "report": job id, "gemm_search": job id}; empty where nothing was
    submitted."""
    try:
        manifest = json.loads(manifest_path(sweep).read_text())
    except FileNotFoundError:
        return {"points": {}}
    except (OSError, ValueError) as error:
        raise UsageError(f"{manifest_path(sweep)}: not a manifest of submitted jobs ({error}); "
                         "move it away to start the sweep's job records afresh") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("points"), dict):
        raise UsageError(f"{manifest_path(sweep)}: not a manifest of submitted jobs")
    return manifest


def write_atomically(path, text):
    """Writes text to path through a temporary file beside it, renamed over it: a reader
    sees the old file or the new, never a part."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def script_digest(text):
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def failure_reason(path):
    """The failure_reason attribute of a result file, "" where it has none or does not read."""
    try:
        import h5py
    except ImportError:
        dump = subprocess.run(["h5dump", "-a", "/failure_reason", str(path)], capture_output=True, text=True)
        match = re.search(r'\(0\): "(.*)"', dump.stdout)
        return match.group(1) if match else ""
    try:
        with h5py.File(path, "r") as handle:
            reason = handle.attrs.get("failure_reason", "")
            return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    except Exception:  # h5py raises OSError, KeyError, RuntimeError or ValueError by HDF5's error
        return ""


def result_description(path):
    """The result file's state in words: complete, failed: REASON, running (.partial),
    unreadable: WHY, or absent."""
    status, why = result_state(path)
    if status == "missing":
        return "absent"
    if status == "running":
        return "running (.partial)"
    if status == "failed":
        reason = failure_reason(path)
        return f"failed: {reason}" if reason else "failed"
    return f"{status}: {why}" if why else status


def log_lines(path):
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except (OSError, TypeError):
        return []


def held_reason(point, job, log):
    """Why the point's failure would come again with the same script (bad input, or out of
    memory), naming it from the result file or the log; "" where it would not."""
    reason = failure_reason(point.result) if result_status(point.result) == "failed" else ""
    said = [("failure_reason", reason)] + [("log", line) for line in log_lines(log)]
    # Out of memory first: a usage error that says so (a model too big for the GPU) is one.
    for source, line in said:
        for pattern, kind in ((OUT_OF_MEMORY, "out of memory"), (BAD_INPUT, "bad input")):
            found = pattern.search(line) if line else None
            if found:
                return f"{kind} ({source}: {found.group(0).strip()})"
    if job is not None and job.state == "OUT_OF_MEMORY":
        return f"out of memory (job {job.text()})"
    if job is not None and job.exit_status == USAGE_ERROR and not job.signal:
        return f"bad input (job {job.text()})"
    return ""


@dataclass(frozen=True)
class Verdict:
    """What a resume does with a point: 'complete', 'waiting' (its job is not over), 'held'
    (its failure would come again), or 'rerun'; and why."""
    action: str
    why: str = ""


def verdict(point, entry, job, script_text=None):
    """What a resume does with a point, given its manifest entry (None where the sweep
    never submitted it), its job's state and the script it would be submitted with now."""
    if result_status(point.result) == "complete":
        return Verdict("complete")
    if entry is None:
        return Verdict("rerun", "not submitted before")
    if job is not None and job.state in ACTIVE_STATES:
        return Verdict("waiting", f"job {entry['job']} is {job.state}")
    reason = held_reason(point, job, entry.get("log"))
    if reason:
        if script_text is not None and script_digest(script_text) != entry.get("script_sha256"):
            return Verdict("rerun", f"{reason}, and its script has changed since")
        return Verdict("held", reason)
    if job is not None and job.state in RERUN_STATES:
        return Verdict("rerun", f"job {entry['job']} ended {job.state} before the run completed")
    state = job.text() if job is not None else "unknown"
    return Verdict("rerun", f"job {entry['job']} ended {state} without a complete result")


def point_verdicts(sweep, points, scripts=None):
    """[(point, its manifest entry or None, its JobState or None, Verdict)], the jobs'
    states asked of Slurm once. `scripts` maps a label to the script it would be submitted
    with now (a changed script lifts a hold)."""
    entries = read_manifest(sweep)["points"]
    ids = [entries[point.label()]["job"] for point in points if point.label() in entries]
    states = job_states(ids)
    answers = []
    for point in points:
        entry = entries.get(point.label())
        job = states.get(entry["job"]) if entry else None
        answers.append((point, entry, job, verdict(point, entry, job, (scripts or {}).get(point.label()))))
    return answers


def record_submitted(sweep, submitted, report_id, search_id=None):
    """Adds the points just submitted ({label: entry}), the report's job and the GEMM
    searches' job to the manifest, atomically."""
    manifest = read_manifest(sweep)
    manifest["points"].update(submitted)
    if report_id:
        manifest["report"] = report_id
    if search_id:
        manifest["gemm_search"] = search_id
    write_atomically(manifest_path(sweep), json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def active_search_job(sweep):
    """The job of the sweep's last GEMM searches where Slurm says it is not over, else
    None: searches of one file at once are refused, so new ones wait for it."""
    job = read_manifest(sweep).get("gemm_search")
    if job and job_states([job])[job].state in ACTIVE_STATES:
        return job
    return None


def job_log(sweep, point, job_id):
    """The log Slurm writes for a point's job (#SBATCH --output, %x-%j)."""
    return sweep.output_dir / "logs" / f"{sweep.name}-{point.label()}-{job_id}.out"


def show_status(sweep, points):
    """Prints every point with its result file's state, its job's state where the sweep
    submitted it, and what a resume does with it; then the jobs of the GEMM searches and
    the report."""
    manifest = read_manifest(sweep)
    answers = point_verdicts(sweep, points)
    print(f"sweep {sweep.name}: {len(points)} point(s), results in {sweep.output_dir}")
    width = max(len(point.label()) for point in points)
    for point, entry, job, said in answers:
        job_text = f"job {entry['job']} {job.text()}" if entry else "not submitted"
        action = {"complete": "done", "waiting": "waiting", "held": "not rerun", "rerun": "rerun"}[said.action]
        why = f" ({said.why})" if said.why and said.action != "waiting" else ""
        print(f"  {point.label():{width}s}  {result_description(point.result)}  [{job_text}]  resume: {action}{why}")
    if manifest.get("gemm_search"):
        (search,) = job_states([manifest["gemm_search"]]).values()
        path = gemm_algos_file(sweep)
        print(f"  {'gemm-search':{width}s}  {path}{'' if path.exists() else ' (absent)'}"
              f"  [job {manifest['gemm_search']} {search.text()}]")
    if manifest.get("report"):
        (report,) = job_states([manifest["report"]]).values()
        print(f"  {'report':{width}s}  {sweep.output_dir / 'report' / 'report.md'}"
              f"{'' if (sweep.output_dir / 'report' / 'report.md').exists() else ' (absent)'}"
              f"  [job {manifest['report']} {report.text()}]")
    counts = {}
    for *_, said in answers:
        counts[said.action] = counts.get(said.action, 0) + 1
    print(", ".join(f"{counts[action]} {name}" for action, name in
                    (("complete", "complete"), ("waiting", "waiting for their jobs"), ("rerun", "to rerun"),
                     ("held", "not rerun (bad input or out of memory)")) if counts.get(action)))
    return 0


def resume_decisions(sweep, pending, texts, quiet=False):
    """(to run, job ids still pending or running, points held) among the pending points,
    by what Slurm says became of the jobs of those submitted before; each said in a line
    unless quiet."""
    say = (lambda text: None) if quiet else print
    waiting, held, to_run = [], [], []
    for point, entry, job, said in point_verdicts(sweep, pending, texts):
        if said.action == "waiting":
            waiting.append(entry["job"])
            say(f"{point.label()}: {said.why}; not submitted again")
        elif said.action == "held":
            held.append(point)
            say(f"{point.label()}: not rerun, {said.why} (log {entry.get('log')}); it runs again once a "
                "change to the experiment changes its script")
        else:
            if entry is not None:
                say(f"{point.label()}: rerun: {said.why}")
            to_run.append(point)
    return to_run, waiting, held
