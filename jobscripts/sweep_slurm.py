"""The Slurm jobs of a sweep: each point's sbatch script (its modules, container and
start-up retry), the job arrays that run the points of one shape, the report's job, and
write_slurm, which writes them and submits them where asked."""
import shlex
import shutil
import subprocess
import sys

from script_cli import USAGE_ERROR, UsageError
from sweep_plan import (START_RETRY_CAUSE, container_mounts_of, nodes_for, pending_points, point_arguments,
                        prediction_command, rank_command, ranks_per_node, report_command, result_status)
from sweep_status import job_log, record_submitted, resume_decisions, script_digest, write_atomically


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


def sbatch_script(sweep, point, binary):
    nodes, per_node = shape_of(sweep, point)
    lines = sbatch_header(sweep, nodes, per_node, f"{sweep.name}-{point.label()}", "%x-%j.out")
    srun_args = list(sweep.srun_args) + ([f"--gpu-bind={sweep.gpu_bind}"] if sweep.gpu_bind else [])
    launch = (["srun"] + srun_args + [f"--ntasks={point.ranks}"] + pyxis_options(sweep)
              + rank_command(sweep, binary) + point_arguments(sweep, point))
    lines += ["set -euo pipefail"]
    lines += module_lines(sweep)
    # The experiment's [env], and nothing else, after the modules (so that it overrides
    # theirs): srun passes the script's environment on to every rank.
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sweep.env]
    lines += [f"mkdir -p {shlex.quote(str(point.result.parent))}"] + retried_launch_lines(point, launch) + [""]
    return "\n".join(lines)


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
    if not units:
        what = "the report only, no point to submit"
    elif sweep.arrays:
        what = (f"{len(units)} job array(s) (" + ", ".join(f"{len(group)} point(s) on {shape[0]} node(s) x "
                                                          f"{shape[1]} rank(s)" for shape, group in units)
                + (f", at most {sweep.array_throttle} task(s) of each at once" if sweep.array_throttle else "")
                + ") and the report")
    else:
        what = f"one job per point ({len(units)}) and the report"
    print(f"  with --launcher slurm --submit: {len(units) + 1} sbatch call(s): {what}"
          + (f"; {len(waiting)} point(s) wait for jobs submitted before" if waiting else "")
          + (f"; {len(held)} point(s) not rerun (bad input or out of memory)" if held else ""))


def write_slurm(sweep, points, binary, submit, submit_command):
    jobs_dir = sweep.output_dir / "jobs"
    (sweep.output_dir / "logs").mkdir(parents=True, exist_ok=True)
    jobs_dir.mkdir(parents=True, exist_ok=True)
    pending = pending_points(points)
    texts = {point.label(): sbatch_script(sweep, point, binary) for point in pending}
    # A point submitted before is submitted again only by what Slurm says its job did.
    to_run, waiting, held = resume_decisions(sweep, pending, texts)
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
    report = jobs_dir / "report.sbatch"
    report.write_text(report_script(sweep))
    arrays = f" in {len(units)} job array(s)" if sweep.arrays and units else ""
    print(f"sweep {sweep.name}: wrote {len(to_run)} job script(s) for the pending points{arrays} "
          f"({len(points) - len(pending)} complete) and {report}"
          + (f"; {len(waiting)} point(s) wait for their jobs" if waiting else "")
          + (f"; {len(held)} point(s) not rerun: " + ", ".join(point.label() for point in held) if held else ""))
    if not submit:
        print(f"submit them with: {submit_command}")
        return 0
    sbatch = shutil.which("sbatch")
    if not sbatch:
        raise UsageError("--submit: sbatch is not on PATH")
    job_ids, submitted = [], {}
    try:
        for script, group in units:
            out = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"sbatch {script} failed: {out.stderr.strip()}", file=sys.stderr)
                return 1
            job_ids.append(out.stdout.strip().split(";")[0])
            # An array's task i runs the group's point i: its job is JOBID_i.
            runs = ([(point, f"{job_ids[-1]}_{index}") for index, point in enumerate(group)] if sweep.arrays
                    else [(group[0], job_ids[-1])])
            for point, job in runs:
                submitted[point.label()] = {"job": job, "log": str(job_log(sweep, point, job)),
                                            "result": str(point.result),
                                            "script_sha256": script_digest(texts[point.label()])}
            what = f"job array {job_ids[-1]} ({len(group)} point(s))" if sweep.arrays else f"job {job_ids[-1]}"
            print(f"submitted {script.name} as {what}")
    finally:
        # Every job submitted is recorded, also where a later sbatch failed.
        record_submitted(sweep, submitted, None)
    after = job_ids + waiting
    dependency = ["--dependency=afterany:" + ":".join(after)] if after else []
    out = subprocess.run([sbatch, "--parsable"] + dependency + [str(report)], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"sbatch {report} failed: {out.stderr.strip()}", file=sys.stderr)
        return 1
    report_id = out.stdout.strip().split(";")[0]
    record_submitted(sweep, {}, report_id)
    print(f"submitted the report as job {report_id}; it runs after the points and writes "
          f"{sweep.output_dir / 'report' / 'report.md'}"
          + (f" and the predictions, {sweep.output_dir / 'prediction' / 'prediction.md'}" if sweep.network else ""))
    (sweep.output_dir / "jobs" / "submitted.txt").write_text("\n".join(job_ids + [report_id]) + "\n")
    return 0
