"""The Slurm jobs of a sweep: each point's sbatch script (its modules, container and
start-up retry), the job arrays that run the points of one shape, the job of the GEMM
searches that the training jobs wait for (gemm_search = on), the report's job, and
write_slurm, which writes them and submits them where asked."""
import dataclasses
import shlex
import shutil
import subprocess
import sys

from script_cli import USAGE_ERROR, UsageError
from sweep_plan import (START_RETRY_CAUSE, Point, container_mounts_of, gemm_search_arguments, gemm_searches,
                        nodes_for, pending_points, point_arguments, prediction_command, rank_command, ranks_per_node,
                        report_command, result_status)
from sweep_status import (active_search_job, job_log, record_submitted, resume_decisions, script_digest,
                          write_atomically)


# Where a shell finds `module` when it was not handed one (by the submitting shell's
# environment, or BASH_ENV): the init script under the site's MODULESHOME, else where the
# packages and install guides of Lmod and of Environment Modules put theirs.
MODULE_INITS = ("/usr/share/lmod/lmod/init/bash",  # Lmod: Debian, Ubuntu, EPEL
                "/opt/apps/lmod/lmod/init/bash",  # Lmod built as its guide says
                "/usr/share/modules/init/bash",  # Environment Modules: Debian, Ubuntu
                "/usr/share/Modules/init/bash")  # Environment Modules: RHEL and its rebuilds
NO_MODULE_COMMAND = 127


def module_lines(sweep):
    """The shell lines that load the experiment's modules (after `module purge` where
    asked), under Lmod or Environment Modules; none without modules. A module that does not
    load ends the script (set -e), as does a shell where no `module` can be found."""
    if not sweep.modules and not sweep.module_purge:
        return []
    lines = ["# The site's modules. `module` is the shell function of Lmod or Environment Modules.",
             "set +u",
             "if ! type module >/dev/null 2>&1; then",
             f'  for init in ${{MODULESHOME:+"$MODULESHOME/init/bash"}} {" ".join(MODULE_INITS)}; do',
             '    if [ -r "$init" ]; then . "$init"; break; fi',
             "  done",
             "fi",
             "if ! type module >/dev/null 2>&1; then",
             '  echo "scalestudy: no module command on $(hostname): neither Lmod nor Environment Modules was '
             'found" >&2',
             f"  exit {NO_MODULE_COMMAND}",
             "fi"]
    if sweep.module_purge:
        lines.append("module purge")
    lines += [f"module load {shlex.quote(name)}" for name in sweep.modules]
    return lines + ["set -u"]


def pyxis_options(sweep):
    """srun's options that run every rank in the pyxis image; none without one."""
    if not sweep.container_image:
        return []
    options = [f"--container-image={sweep.container_image}",
               f"--container-mounts={','.join(container_mounts_of(sweep))}"]
    if sweep.container_workdir:
        options.append(f"--container-workdir={sweep.container_workdir}")
    return options


def srun_words(sweep, ranks, binary):
    """srun with its options and the command each of `ranks` ranks runs, up to the
    binary's arguments."""
    srun_args = list(sweep.srun_args) + ([f"--gpu-bind={sweep.gpu_bind}"] if sweep.gpu_bind else [])
    return ["srun"] + srun_args + [f"--ntasks={ranks}"] + pyxis_options(sweep) + rank_command(sweep, binary)


def environment_lines(sweep):
    """A job's lines before its launches: strict mode, the modules, and the experiment's
    [env], and nothing else, after the modules (so that it overrides theirs): srun passes
    the script's environment on to every rank."""
    return (["set -euo pipefail"] + module_lines(sweep)
            + [f"export {name}={shlex.quote(value)}" for name, value in sweep.env])


def sbatch_script(sweep, point, binary):
    nodes, per_node = shape_of(sweep, point)
    lines = sbatch_header(sweep, nodes, per_node, f"{sweep.name}-{point.label()}", "%x-%j.out")
    launch = srun_words(sweep, point.ranks, binary) + point_arguments(sweep, point)
    lines += environment_lines(sweep)
    lines += [f"mkdir -p {shlex.quote(str(point.result.parent))}"] + retried_launch_lines(point, launch) + [""]
    return "\n".join(lines)


# The least time a search is given: 25-35 s a GEMM shape, 10-12 minutes for GPT-2 small's
# 18-28 shapes and up to 19 with at most 16 more beside an overlapped lane; larger
# models' shapes take longer bursts in the neighbour search.
SEARCH_SECONDS = 45 * 60


def gemm_search_script(sweep, searches, binary):
    """The job of the GEMM searches: one node, one rank, one GPU, the searches in turn, each
    launched as a one-rank point is; the first that fails ends the job with its exit status
    (set -e). Each search has the sweep's time limit, and at least SEARCH_SECONDS."""
    per_search = max(slurm_seconds(sweep.time_limit), SEARCH_SECONDS)
    timed = dataclasses.replace(sweep, time_limit=slurm_time(per_search * len(searches)))
    lines = sbatch_header(timed, 1, 1, f"{sweep.name}-gemm-search", "%x-%j.out") + environment_lines(sweep)
    lines.append("# The GEMM searches in turn, into the sweep's choice file, which every training point reads.")
    for search in searches:
        lines += ["echo " + shlex.quote(f"scalestudy: {search.label()}: micro-batch {search.micro_batch}, "
                                        f"reserve {search.reserve}"),
                  shlex.join(srun_words(sweep, 1, binary) + gemm_search_arguments(sweep, search))]
    return "\n".join(lines + [""])


def slurm_seconds(text):
    """Slurm's --time (minutes, minutes:seconds, hours:minutes:seconds, or days-hours with
    :minutes and :seconds) in seconds."""
    days, _, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = parts if len(parts) == 3 else ([0] + parts + [0])[:3]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds):
    """Seconds in Slurm's days-hours:minutes:seconds (hours:minutes:seconds under a day)."""
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{seconds:02d}"


def retried_launch_lines(point, launch):
    """The shell lines that run `launch` (its words) and start it once more where it ended
    before the run created its result file (start_failed's rule); the script ends with the
    launch's exit status."""
    result = shlex.quote(str(point.result))
    command = shlex.join(launch)
    message = shlex.quote(f"scalestudy: {point.label()}: the launch ended with exit status ")
    cause = shlex.quote(f": {START_RETRY_CAUSE}; starting it once more")
    return ["# The point's launch; started once more where it ends before the run created its result file.",
            "launch() {",
            command,
            "}",
            f"result={result}",
            "# The files at the result's path: the run has begun writing once one of them changes.",
            'result_files() { stat -c "%n %i %s %y" -- "$result" "$result.partial" 2>/dev/null || true; }',
            "before=$(result_files)",
            "status=0",
            "launch || status=$?",
            f'if [ "$status" -ne 0 ] && [ "$status" -ne {USAGE_ERROR} ] && [ "$(result_files)" = "$before" ]; then',
            f'  echo {message}"$status"{cause}',
            "  status=0",
            "  launch || status=$?",
            "fi",
            'exit "$status"']


def shape_of(sweep, point):
    """(nodes, ranks per node): what a point asks of Slurm besides the sweep's options, so
    that points of one shape share a job array."""
    return nodes_for(sweep, point), ranks_per_node(sweep, point)


def sbatch_header(sweep, nodes, per_node, job_name, output):
    """The #SBATCH lines of a job of this shape: the point's own, or an array's."""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={per_node}",
             f"#SBATCH --cpus-per-task={sweep.cpus_per_task}",
             f"#SBATCH --time={sweep.time_limit}",
             f"#SBATCH --output={sweep.output_dir / 'logs'}/{output}"]
    if sweep.backend == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    if sweep.exclusive:
        lines.append("#SBATCH --exclusive")
    if sweep.constraint:
        lines.append(f"#SBATCH --constraint={sweep.constraint}")
    if sweep.mem:
        lines.append(f"#SBATCH --mem={sweep.mem}")
    lines += site_lines(sweep)
    if sweep.signal_before_limit_s:
        # Every rank gets SIGTERM this long before the time limit, and scalestudy closes its
        # result file as failed, naming the signal, before Slurm kills the step.
        lines.append(f"#SBATCH --signal=TERM@{sweep.signal_before_limit_s}")
    return lines


def array_groups(sweep, points):
    """{(nodes, ranks per node): [points]}: the points of each shape, in the plan's order."""
    groups = {}
    for point in points:
        groups.setdefault(shape_of(sweep, point), []).append(point)
    return groups


def array_name(shape):
    return f"array-n{shape[0]}x{shape[1]}"


def array_script(sweep, shape, tasks_file, count):
    """The job array of `count` points of one shape: task i runs the point on line i + 1 of
    tasks_file (its label) through the point's own script (start-up retry included), its
    output in the log a job of the point's own would have."""
    logs, jobs = sweep.output_dir / "logs", sweep.output_dir / "jobs"
    lines = sbatch_header(sweep, *shape, f"{sweep.name}-{array_name(shape)}", "%x-%A_%a.out")
    lines.append(f"#SBATCH {array_option(sweep, count)}")
    log = (shlex.quote(f"{logs}/{sweep.name}-") + '"$label"'
           + shlex.quote("-") + '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' + shlex.quote(".out"))
    lines += ["set -euo pipefail",
              "# This task's point: line SLURM_ARRAY_TASK_ID + 1 of the list the sweep wrote.",
              f"tasks={shlex.quote(str(tasks_file))}",
              'label=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$tasks")',
              'case "$label" in',
              '  "" | *[!A-Za-z0-9._-]*)',
              '    echo "scalestudy: array task $SLURM_ARRAY_TASK_ID: no point on its line of $tasks" >&2',
              "    exit 1 ;;",
              "esac",
              "# The point's log, named as a job of the point's own would name it.",
              f"exec > {log} 2>&1",
              f"exec bash {shlex.quote(str(jobs))}/" + '"$label".sbatch',
              ""]
    return "\n".join(lines)


def submission_units(sweep, points):
    """What one sbatch each submits: [(shape, points)], a job array per shape, or with
    arrays = off [(None, [point])] for each point."""
    if not sweep.arrays:
        return [(None, [point]) for point in points]
    return list(array_groups(sweep, points).items())


def array_option(sweep, count):
    return f"--array=0-{count - 1}" + (f"%{sweep.array_throttle}" if sweep.array_throttle else "")


def site_lines(sweep):
    """The #SBATCH lines of where a job may run, which the report's job shares."""
    return [f"#SBATCH --{option}={value}"
            for option, value in (("partition", sweep.partition), ("account", sweep.account), ("qos", sweep.qos),
                                  ("reservation", sweep.reservation))
            if value]


def report_script(sweep):
    logs = sweep.output_dir / "logs"
    return "\n".join(["#!/bin/bash",
                      f"#SBATCH --job-name={sweep.name}-report",
                      "#SBATCH --nodes=1",
                      "#SBATCH --ntasks=1",
                      f"#SBATCH --time={sweep.time_limit}",
                      f"#SBATCH --output={logs}/%x-%j.out"]
                     + site_lines(sweep)
                     + ["set -euo pipefail",
                        "# The report, then the predictions, which run whatever became of the report.",
                        "status=0",
                        shlex.join(report_command(sweep)) + " || status=$?",
                        prediction_line(sweep),
                        'exit "$status"', ""])


def prediction_line(sweep):
    """The report job's line of the predictions: scalestudy-predict, or where the
    experiment names no network file, a line in the job's log saying there are none."""
    command = prediction_command(sweep)
    if command is None:
        return ("echo " + shlex.quote("scalestudy: no predictions: the experiment names no network file "
                                      "(network = FILE in [sweep], e.g. experiments/networks/ib-ndr-400.ini)"))
    return shlex.join(command) + " || status=$?"


def print_submissions(sweep, points, binary):
    """The dry run's count of the sbatch calls that --launcher slurm --submit makes."""
    pending = [point for point in points if result_status(point.result) != "complete"]
    texts = {point.label(): sbatch_script(sweep, point, binary) for point in pending}
    to_run, waiting, held = resume_decisions(sweep, pending, texts, quiet=True)
    units = submission_units(sweep, to_run)
    searches = gemm_searches(sweep, to_run)
    if not units:
        what = "the report only, no point to submit"
    elif sweep.arrays:
        what = (f"{len(units)} job array(s) (" + ", ".join(f"{len(group)} point(s) on {shape[0]} node(s) x "
                                                          f"{shape[1]} rank(s)" for shape, group in units)
                + (f", at most {sweep.array_throttle} task(s) of each at once" if sweep.array_throttle else "")
                + ") and the report")
    else:
        what = f"one job per point ({len(units)}) and the report"
    first = f"the GEMM searches' job ({len(searches)} search(es), before the training jobs), " if searches else ""
    print(f"  with --launcher slurm --submit: {len(units) + 1 + bool(searches)} sbatch call(s): {first}{what}"
          + (f"; {len(waiting)} point(s) wait for jobs submitted before" if waiting else "")
          + (f"; {len(held)} point(s) not rerun (bad input or out of memory)" if held else ""))


def write_units(sweep, to_run, texts, jobs_dir):
    """Writes the scripts of the points to run, and their arrays' scripts and task lists;
    returns [(script to submit, its points)]."""
    for point in to_run:
        (jobs_dir / f"{point.label()}.sbatch").write_text(texts[point.label()])
    units = []
    for shape, group in submission_units(sweep, to_run):
        if shape is None:
            units.append((jobs_dir / f"{group[0].label()}.sbatch", group))
            continue
        # The task list is named by its content: an array still queued from an earlier
        # submission keeps reading its own.
        labels = "".join(point.label() + "\n" for point in group)
        tasks = jobs_dir / f"{array_name(shape)}-{script_digest(labels)[:12]}.points"
        write_atomically(tasks, labels)
        script = jobs_dir / f"{array_name(shape)}.sbatch"
        script.write_text(array_script(sweep, shape, tasks, len(group)))
        units.append((script, group))
    return units


def write_search(sweep, to_run, binary, jobs_dir):
    """Writes the job of the GEMM searches the points to run need: (its script, the number
    of searches), or (None, 0) where there is none."""
    searches = gemm_searches(sweep, to_run)
    if not searches:
        return None, 0
    script = jobs_dir / "gemm-search.sbatch"
    script.write_text(gemm_search_script(sweep, searches, binary))
    return script, len(searches)


def write_slurm(sweep, points, binary, submit, submit_command):
    jobs_dir = sweep.output_dir / "jobs"
    (sweep.output_dir / "logs").mkdir(parents=True, exist_ok=True)
    jobs_dir.mkdir(parents=True, exist_ok=True)
    pending = pending_points(points)
    texts = {point.label(): sbatch_script(sweep, point, binary) for point in pending}
    # A point submitted before is submitted again only by what Slurm says its job did.
    to_run, waiting, held = resume_decisions(sweep, pending, texts)
    units = write_units(sweep, to_run, texts, jobs_dir)
    search, searches = write_search(sweep, to_run, binary, jobs_dir)
    report = jobs_dir / "report.sbatch"
    report.write_text(report_script(sweep))
    arrays = f" in {len(units)} job array(s)" if sweep.arrays and units else ""
    print(f"sweep {sweep.name}: wrote {len(to_run)} job script(s) for the pending points{arrays} "
          f"({len(points) - len(pending)} complete) and {report}"
          + (f"; {search} runs {searches} GEMM search(es) before them" if search else "")
          + (f"; {len(waiting)} point(s) wait for their jobs" if waiting else "")
          + (f"; {len(held)} point(s) not rerun: " + ", ".join(point.label() for point in held) if held else ""))
    if not submit:
        print(f"submit them with: {submit_command}")
        return 0
    sbatch = shutil.which("sbatch")
    if not sbatch:
        raise UsageError("--submit: sbatch is not on PATH")
    search_ids = [submit_search(sbatch, sweep, search, searches)] if search else []
    if None in search_ids:
        return 1
    job_ids = submit_units(sbatch, sweep, units, texts, search_ids)
    if job_ids is None:
        return 1
    return submit_report(sbatch, sweep, report, search_ids + job_ids, waiting)


def submit(sbatch, options, script):
    """Submits script with options: its job id, or None where sbatch fails (said on stderr)."""
    out = subprocess.run([sbatch, "--parsable"] + options + [str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"sbatch {script} failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    return out.stdout.strip().split(";")[0]


def submit_search(sbatch, sweep, script, searches):
    """Submits the job of the GEMM searches, after the sweep's earlier one where Slurm says
    that one is not over (two searches of one file at once are refused), and records it;
    its job id, or None where sbatch failed."""
    earlier = active_search_job(sweep)
    job_id = submit(sbatch, [f"--dependency=afterany:{earlier}"] if earlier else [], script)
    if job_id:
        record_submitted(sweep, {}, None, job_id)
        print(f"submitted {script.name} as job {job_id} ({searches} GEMM search(es)"
              + (f", after job {earlier}, the searches submitted before" if earlier else "")
              + "); the training jobs start once it succeeds, and are cancelled where it fails")
    return job_id


def after_searches(search_ids):
    """sbatch's options that hold a training job until the GEMM searches' job has
    succeeded, and cancel it where that job fails; none without searches."""
    if not search_ids:
        return []
    return ["--dependency=afterok:" + ":".join(search_ids), "--kill-on-invalid-dep=yes"]


def submit_units(sbatch, sweep, units, texts, search_ids):
    """Submits each job or array (those holding a training point after the GEMM searches)
    and records them; their job ids, or None where an sbatch failed."""
    job_ids, submitted = [], {}
    try:
        for script, group in units:
            training = any(isinstance(point, Point) for point in group)
            job_id = submit(sbatch, after_searches(search_ids) if training else [], script)
            if job_id is None:
                return None
            job_ids.append(job_id)
            # An array's task i runs the group's point i: its job is JOBID_i.
            runs = ([(point, f"{job_id}_{index}") for index, point in enumerate(group)] if sweep.arrays
                    else [(group[0], job_id)])
            for point, job in runs:
                submitted[point.label()] = {"job": job, "log": str(job_log(sweep, point, job)),
                                            "result": str(point.result),
                                            "script_sha256": script_digest(texts[point.label()])}
            what = f"job array {job_id} ({len(group)} point(s))" if sweep.arrays else f"job {job_id}"
            print(f"submitted {script.name} as {what}")
    finally:
        # Every job submitted is recorded, also where a later sbatch failed.
        record_submitted(sweep, submitted, None)
    return job_ids


def submit_report(sbatch, sweep, report, job_ids, waiting):
    """Submits the report's job, after every job just submitted and those of earlier
    submissions still waiting, and records it; the sweep's exit status."""
    after = job_ids + waiting
    report_id = submit(sbatch, ["--dependency=afterany:" + ":".join(after)] if after else [], report)
    if report_id is None:
        return 1
    record_submitted(sweep, {}, report_id)
    print(f"submitted the report as job {report_id}; it runs after the points and writes "
          f"{sweep.output_dir / 'report' / 'report.md'}"
          + (f" and the predictions, {sweep.output_dir / 'prediction' / 'prediction.md'}" if sweep.network else ""))
    (sweep.output_dir / "jobs" / "submitted.txt").write_text("\n".join(job_ids + [report_id]) + "\n")
    return 0
