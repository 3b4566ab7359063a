#!/usr/bin/env python3
"""Runs the scaling sweep an experiment file declares: locally with mpirun, or on a
Slurm cluster as one job array per shape of point (nodes and ranks per node; with
arrays = off, one job per point) plus a report job that runs after them.

    jobscripts/sweep.py experiments/quickstart.ini --dry-run
    jobscripts/sweep.py experiments/quickstart.ini --launcher local
    jobscripts/sweep.py experiments/gpt2-small-strong.ini --launcher slurm --submit
    jobscripts/sweep.py status experiments/gpt2-small-strong.ini

A point is one (scaling, strategy, overlap, GPU count, repeat). Its result file is
complete once `scalestudy train` has marked it so and it reads back whole; running the
sweep again skips every complete point, so an interrupted sweep picks up where it stopped.
On Slurm it asks what became of each point's job (jobs/submitted.json records which job
runs which point): a point whose job is pending or running is not submitted again; one
whose job ended TIMEOUT, PREEMPTED, NODE_FAIL or CANCELLED is; one that failed on bad input
or out of memory is listed with the reason, and not rerun until its script changes.
`sweep.py status EXPERIMENT` shows all of it, point by point.

Every sweep also carries one `scalestudy bench comm` point at its largest GPU count,
placed on the nodes as that count's training points are: allreduce, reduce-scatter and
allgather over every rank (world), over each node's ranks (intra_node) and over one rank
per node (inter_node), where such a communicator has two ranks or more. Its file,
<output_dir>/bench-comm/n<N>.h5, calibrates the collectives of `scalestudy-predict`,
which finds it there; it is skipped when complete like any point. On the cpu backend it
measures payloads up to 1 MiB with few samples, a few seconds. `bench_comm = off` in
[sweep] leaves it out; a sweep whose largest point has one rank has none.

Before anything is written, run or submitted, the binary says what it can run
(`scalestudy info --json`) and checks every training point's options
(`scalestudy train --check`). One sweep at a time writes into an output folder (a lock
file there, .sweep.lock).
SIGINT or SIGTERM stops a local sweep: the running point's ranks get the signal, mark
their file failed, and the sweep exits 130 or 143.

A site's software reaches the points through [sweep] keys: `modules` are loaded (after
`module purge` with module_purge = yes) before every launch, in each sbatch script and,
with --launcher local, in the environment of mpirun and of the binary's checks; a pyxis
image (container_image) goes on srun's line, an Apptainer image (apptainer_image) runs
each rank through `apptainer exec`, and container_binary names the binary inside it.

With gemm_search = on in [sweep] (cuda, 16-bit), every training point reads the choice
file <output_dir>/gemm-algos.txt, and `scalestudy gemm-search` fills it first: one search
per micro-batch of the pending training points, before any of them runs (on Slurm, one
job that the training jobs wait for).
"""
import signal
import sys

if __name__ == "__main__":
    # Outside main(), while the sweep starts or ends, no point is running: a stop says so
    # in one line.
    def stopped_at_start(signum, frame):
        print(f"sweep: stopped by {signal.Signals(signum).name}; no point was running", file=sys.stderr)
        sys.exit(128 + signum)

    for _stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_stop_signal, stopped_at_start)

import argparse
import concurrent.futures
import dataclasses
import fcntl
import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

from script_cli import USAGE_ERROR, UsageError, binary_info
from sweep_experiment import PATH_EXPECTED, PATH_TEXT, ROOT, SWEEP_KEYS, check_form, parse_gpu_counts, read_experiment
from sweep_local import SearchFailed, Stopped, raise_stopped, report_after_points, run_local, stop_descendants
from sweep_plan import (GemmSearch, Point, bench_comm_points, plan, print_plan, rank_command, status_text,
                        train_arguments)
from sweep_slurm import NO_MODULE_COMMAND, module_lines, print_submissions, pyxis_options, write_slurm
from sweep_status import show_status


def default_binary(backend):
    return ROOT / "build" / backend / "scalestudy"


def binary_of(args, sweep):
    """The binary the points run: --binary, or else the build of the experiment's backend
    (build/cpu or build/cuda), never the CPU build for a cuda experiment."""
    binary = Path(args.binary) if args.binary else default_binary(sweep.backend)
    if not binary.is_file():
        option = f"--binary {args.binary}" if args.binary else f"the default binary {binary}"
        raise UsageError(f"{option}: no such file (build the {sweep.backend} preset, or pass --binary)")
    if not os.access(binary, os.X_OK):
        raise UsageError(f"--binary {binary}: not executable")
    return binary.resolve()


def binaries_of(args, sweep):
    """(launched, checker): the binary the points run, and the one on this host that checks
    them first. Without a container both are binary_of's. In a container the points run
    container_binary, else --binary's path (the default build's without it), absolute; the
    checker is --binary (or the default build) where this host has it, else None."""
    if not sweep.containerised():
        binary = binary_of(args, sweep)
        return binary, binary
    host = Path(args.binary) if args.binary else default_binary(sweep.backend)
    here = host.is_file() and os.access(host, os.X_OK)
    if sweep.container_binary:
        launched = Path(sweep.container_binary)
    elif here or host.is_absolute():
        launched = Path(os.path.abspath(host))
    else:
        raise UsageError(f"--binary {args.binary}: a relative path, and no such file here; in a container the "
                         "points run the binary at an absolute path (--binary, or container_binary in [sweep])")
    return launched, (host.resolve() if here else None)


def check_capabilities(where, sweep, binary, info):
    backends = info["backends"]
    if sweep.backend not in backends:
        raise UsageError(f"{where}: backend = {sweep.backend}, which {binary} lacks (it has "
                         f"{', '.join(sorted(backends))}); build the {sweep.backend} preset or pass its --binary")
    precision = dict(sweep.train).get("precision", "auto")
    precisions = backends[sweep.backend]["precisions"]
    if precision != "auto" and precision not in precisions:
        raise UsageError(f"{where}: [train] precision = {precision}: {binary} computes {sweep.backend} in "
                         f"{', '.join(precisions)} only")


def check_point(binary, sweep, point, env=None):
    """The point's arguments as `scalestudy train --check` finds them, run in `env`
    (default: this process's environment): "" when the run would start, else the binary's
    message. The choice file of gemm_search = on is left out: the searches write it later."""
    unsearched = dataclasses.replace(sweep, gemm_search=False)
    command = [str(binary)] + train_arguments(unsearched, point) + ["--check", "--check-ranks", str(point.ranks)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    if out.returncode == 0:
        return ""
    message = out.stderr.strip().splitlines()
    return message[-1] if message else f"train --check exited {out.returncode}"


def check_points(where, sweep, points, binary, env=None):
    """Every training point's arguments, checked by the binary before anything is written
    (bench comm's are the sweep's own, and the [train] values it shares are checked with
    the training points')."""
    points = [point for point in points if isinstance(point, Point)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        answers = list(pool.map(lambda point: check_point(binary, sweep, point, env), points))
    for point, answer in zip(points, answers):
        if answer:
            raise UsageError(f"{where}: point {point.label()} ({point.ranks} rank(s)) would not start: {answer}")


# What the shell that loads the modules here prints between its own output and its
# environment.
MODULE_ENV_MARK = "scalestudy: the environment with the modules loaded"


def module_environment(where, sweep, required):
    """This process's environment with the experiment's modules loaded here, by the lines
    every job runs; None where the experiment names none. A module that does not load is a
    usage error naming the key. So is a host without a `module` command where `required`
    (a local run loads the modules here); elsewhere the sweep says so in one line and
    returns None (the jobs load the modules on their nodes)."""
    lines = module_lines(sweep)
    if not lines:
        return None
    named = "modules = " + ", ".join(sweep.modules) if sweep.modules else "module_purge = yes"
    script = "\n".join(["set -euo pipefail"] + lines
                       + [f"printf '\\0%s\\0' {shlex.quote(MODULE_ENV_MARK)}", "env -0"])
    mark = f"\0{MODULE_ENV_MARK}\0".encode()
    try:
        out = subprocess.run(["bash", "-c", script], stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{where}: {named}: loading them here took over 300 s") from None
    if out.returncode != 0 or mark not in out.stdout:
        said = " ".join(line.strip() for line in out.stderr.decode(errors="replace").splitlines() if line.strip())
        if out.returncode == NO_MODULE_COMMAND and "no module command" in said:
            if required:
                raise UsageError(f"{where}: {named}: this host has no module command (neither Lmod nor "
                                 "Environment Modules), and a local sweep loads the modules here")
            print(f"{named}: this host has no module command; the points are checked in this shell's "
                  "environment, and each job loads the modules on its nodes")
            return None
        raise UsageError(f"{where}: {named}: loading them here failed (exit {out.returncode}): "
                         f"{said[:400] or 'no message'}")
    env = {}
    for entry in out.stdout.split(mark, 1)[1].split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name != b"_":
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def lock_output_dir(output_dir):
    """One sweep at a time writes into output_dir: an exclusive flock on its .sweep.lock,
    held while this process lives, the holder's host and pid written in it. Returns the
    open lock file; another sweep holding it is a usage error naming the holder."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / ".sweep.lock"
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "a process that has not written its name yet"
        lock.close()
        raise UsageError(f"--output-dir {output_dir}: another sweep writes there ({holder}, lock {path}); "
                         "wait for it to end, or give another --output-dir") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"host {socket.gethostname()} pid {os.getpid()}\n")
    lock.flush()
    return lock


def sweep_keys_help():
    width = max(map(len, SWEEP_KEYS))
    return "\n".join(["[sweep] keys of an experiment file, with their defaults (docs/experiments.md says",
                      "what each does):"]
                     + [f"  {key:{width}s}  default: {default}" for key, default in SWEEP_KEYS.items()])


def argument_parser():
    parser = argparse.ArgumentParser(description=__doc__, epilog=sweep_keys_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", metavar="EXPERIMENT", help="experiment file (INI with [sweep] and [train])")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every point, print the plan and each point's status, run and write nothing "
                             "(default: off)")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="local: run the points here with mpirun; slurm: write sbatch scripts "
                             "(default: %(default)s)")
    parser.add_argument("--submit", action="store_true",
                        help="with --launcher slurm: submit the scripts (default: off, only write them)")
    parser.add_argument("--binary",
                        help="the scalestudy binary (default: the build of the experiment's backend, "
                             f"{default_binary('BACKEND')}, BACKEND being cpu or cuda)")
    parser.add_argument("--mpirun", default="mpirun",
                        help="MPI launcher for --launcher local (default: %(default)s, found on PATH)")
    parser.add_argument("--no-report", action="store_true",
                        help="local: skip the report after the points (default: off, the report is written)")
    parser.add_argument("--gpus", help="run only these GPU counts, a subset of the experiment's (e.g. 1..4 on a "
                                       "machine with fewer GPUs than the experiment asks for; default: all of them)")
    parser.add_argument("--output-dir", help="write the results here instead of the experiment's output_dir "
                                             "(default: the experiment's output_dir)")
    return parser


def submit_command(argv):
    """The command that submits what this one wrote: the same options, and --submit."""
    script = os.path.relpath(__file__)
    if script.startswith(".."):
        script = __file__
    return shlex.join([script] + list(argv) + ["--submit"])


def planned_sweep(args):
    sweep = read_experiment(args.experiment)
    if args.gpus:
        subset = parse_gpu_counts(args.gpus)
        outside = [n for n in subset if n not in sweep.gpu_counts]
        if outside:
            raise UsageError(f"--gpus {args.gpus}: {outside} not among the experiment's counts "
                             f"{list(sweep.gpu_counts)}")
        sweep = dataclasses.replace(sweep, gpu_counts=subset)
    if args.output_dir:
        check_form("--output-dir", "--output-dir", args.output_dir, PATH_TEXT, PATH_EXPECTED)
        sweep = dataclasses.replace(sweep, output_dir=Path(args.output_dir).absolute())
    return sweep


def print_launch(sweep, binary):
    """What the dry run says of the modules and the container a point's launch goes through."""
    if sweep.modules or sweep.module_purge:
        print("  modules, loaded before every launch: " + ("module purge, then " if sweep.module_purge else "")
              + (", ".join(sweep.modules) or "none"))
    if sweep.container_image:
        print("  every rank in the pyxis image: srun ... " + shlex.join(pyxis_options(sweep) + [str(binary)]))
    if sweep.apptainer_image:
        print("  every rank in the Apptainer image: " + shlex.join(rank_command(sweep, binary)))


def run(args, argv):
    sweep = planned_sweep(args)
    where = f"EXPERIMENT {args.experiment}"
    if args.submit and args.launcher != "slurm":
        raise UsageError("--submit: only with --launcher slurm")
    running_here = args.launcher == "local" and not args.dry_run
    if running_here and sweep.container_image:
        raise UsageError(f"{where}: container_image = {sweep.container_image}: a pyxis container runs through "
                         "srun, with --launcher slurm (a local sweep runs in an Apptainer image, apptainer_image)")
    points = plan(sweep) + bench_comm_points(sweep)
    # The whole sweep is checked before anything is written or run, in the environment of
    # the modules it loads.
    env = module_environment(where, sweep, required=running_here)
    search_path = (env or os.environ).get("PATH", os.defpath)
    if running_here and not shutil.which(args.mpirun, path=search_path):
        raise UsageError(f"--mpirun {args.mpirun}: not found on PATH" + (" (with the modules loaded)" if env else ""))
    if running_here and sweep.apptainer_image and not shutil.which("apptainer", path=search_path):
        raise UsageError(f"{where}: apptainer_image = {sweep.apptainer_image}: apptainer is not on PATH here, "
                         "and a local sweep runs every rank through it")
    binary, checker = binaries_of(args, sweep)
    if checker:
        check_capabilities(where, sweep, checker, binary_info(checker, env))
        check_points(where, sweep, points, checker, env)
    else:
        print(f"the points are not checked before they run: no binary here to check them with "
              f"({args.binary or default_binary(sweep.backend)}), and they run {binary} in the container")
    if args.dry_run:
        print_plan(sweep, points)
        print_launch(sweep, binary)
        print_submissions(sweep, points, binary)
        return 0
    lock = lock_output_dir(sweep.output_dir)
    try:
        if args.launcher == "slurm":
            return write_slurm(sweep, points, binary, args.submit, submit_command(argv))
        try:
            failures = run_local(sweep, points, binary, args.mpirun, env)
        except SearchFailed as failed:
            print(f"sweep: {failed}", file=sys.stderr)
            return 1
        if not args.no_report:
            report_after_points(sweep)
        if failures:
            print(f"{len(failures)} point(s) did not complete: " + ", ".join(p.label() for p in failures))
            return 1
        return 0
    finally:
        lock.close()


def stopped_message(stop):
    point = getattr(stop, "point", None)
    if point is None:
        return f"sweep: stopped by {stop}; run the same command again to go on"
    if isinstance(point, GemmSearch):
        return (f"sweep: stopped by {stop} during {point.label()}: {point.output} keeps the choices it made; "
                "run the same command again to go on")
    return (f"sweep: stopped by {stop} during {point.label()}: {point.result} is "
            f"{status_text(point.result)}; run the same command again to go on")


def status_parser():
    parser = argparse.ArgumentParser(
        prog=f"{Path(__file__).name} status",
        description="Shows every point of a sweep (the training points and the bench comm point) with its "
                    "result file's state (complete, failed with its failure_reason, running with a .partial, "
                    "unreadable, or absent), the state Slurm gives its job where the sweep submitted it "
                    "(sacct; scontrol or squeue where accounting is off), and what running the sweep again "
                    "does with it: rerun, wait for its job, or leave it (bad input or out of memory).")
    parser.add_argument("experiment", metavar="EXPERIMENT", help="experiment file (INI with [sweep] and [train])")
    parser.add_argument("--output-dir", help="the results' folder, where the sweep was given one "
                                             "(default: the experiment's output_dir)")
    parser.add_argument("--gpus", help="only these GPU counts, a subset of the experiment's (default: all of them)")
    return parser


def status(args):
    sweep = planned_sweep(args)
    return show_status(sweep, plan(sweep) + bench_comm_points(sweep))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        args = status_parser().parse_args(argv[1:])
        command = status
    else:
        args = argument_parser().parse_args(argv)
        command = lambda args: run(args, argv)  # noqa: E731
    previous = {signum: signal.signal(signum, raise_stopped) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return command(args)
    except UsageError as error:
        print(f"sweep: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except Stopped as stop:
        stop_descendants(stop.signum, None)
        print(stopped_message(stop), file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
