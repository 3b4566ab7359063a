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
import configparser
import ctypes
import dataclasses
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from script_cli import USAGE_ERROR, UsageError, binary_info

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sweep:
    name: str
    scalings: tuple
    gpu_counts: tuple
    gpus_per_node: int
    ntasks_per_node: int  # ranks per node; at most gpus_per_node on cuda (one GPU a rank)
    gpu_bind: str  # srun's --gpu-bind; "" leaves the cluster's default
    exclusive: bool  # whole nodes, shared with no other job
    constraint: str  # sbatch's --constraint (node features); "" for none
    env: tuple  # (name, value) pairs of [env], exported to every rank of every point
    strategies: tuple
    overlaps: tuple
    repeats: int
    output_dir: Path
    backend: str
    time_limit: str
    cpus_per_task: int
    srun_args: tuple  # srun's options, one token each, quoted where they are written
    partition: str
    account: str
    signal_before_limit_s: int  # SIGTERM this long before the time limit; 0 = none
    train: tuple  # (option, value) pairs passed to `scalestudy train`
    bench_comm: bool  # a bench comm point at the largest GPU count
    qos: str = ""  # sbatch's --qos; "" for none
    reservation: str = ""  # sbatch's --reservation; "" for none
    mem: str = ""  # sbatch's --mem, memory per node; "" for the site's default
    modules: tuple = ()  # environment modules loaded before every launch, in this order
    module_purge: bool = False  # `module purge` before loading them
    container_image: str = ""  # pyxis: srun's --container-image; "" for none
    apptainer_image: str = ""  # Apptainer: each rank runs `apptainer exec IMAGE BINARY`
    container_mounts: tuple = ()  # SRC:DST[:FLAGS], besides the output folder's own mount
    container_workdir: str = ""  # the ranks' working folder inside the container
    container_binary: str = ""  # the binary's path inside the container; "" for --binary's
    network: str = ""  # the network file scalestudy-predict predicts for; "" for no predictions
    arrays: bool = True  # one job array per shape of point; False: one job per point
    array_throttle: int = 0  # at most this many of an array's tasks run at once; 0 for no limit

    def containerised(self):
        return bool(self.container_image or self.apptainer_image)


@dataclass(frozen=True)
class Point:
    scaling: str
    strategy: str
    overlap: str
    ranks: int
    repeat: int
    result: Path

    def label(self):
        return f"{self.scaling}-{self.strategy}-overlap_{self.overlap}-n{self.ranks}-r{self.repeat}"


@dataclass(frozen=True)
class BenchCommPoint:
    """The sweep's `scalestudy bench comm` run on `ranks` ranks, placed as the training
    points of that many ranks are."""
    ranks: int
    result: Path

    def label(self):
        return f"bench-comm-n{self.ranks}"


def split_list(value):
    return tuple(item.strip() for item in re.split(r"[,\s]+", value.strip()) if item.strip())


def parse_gpu_counts(text):
    """'1, 2, 4' or '1..8' (powers of two from 1 up to 8)."""
    text = text.strip()
    match = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", text)
    if match:
        low, high = int(match.group(1)), int(match.group(2))
        if low < 1 or high < low:
            raise UsageError(f"gpus = {text}: the range must go up from at least 1")
        counts, n = [], 1
        while n <= high:
            if n >= low:
                counts.append(n)
            n *= 2
        return tuple(counts)
    try:
        counts = tuple(int(item) for item in split_list(text))
    except ValueError:
        raise UsageError(f"gpus = {text}: expected a list of counts or a range such as 1..8") from None
    if not counts or min(counts) < 1:
        raise UsageError(f"gpus = {text}: counts must be at least 1")
    return counts


# What an experiment file may hold. Every value ends up in a shell script (sbatch), in an
# #SBATCH directive or on a command line, so each is checked for its own syntax, and no
# value may hold a control character (a continuation line's newline included).
NAME = re.compile(r"[A-Za-z0-9._-]+")
SLURM_NAMES = re.compile(r"[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*")
# Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes or days-hours:minutes:seconds.
SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
SRUN_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=\S+)?")
TRAIN_OPTION = re.compile(r"[a-z][a-z0-9-]*")
# Slurm's node features, joined by & (and), | (or) or , (a list).
SLURM_CONSTRAINT = re.compile(r"[A-Za-z0-9._-]+([&|,][A-Za-z0-9._-]+)*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# scalestudy takes the GPU of its local rank among those the rank sees, so every rank must
# see all of its node's GPUs: of srun's --gpu-bind forms, "none" keeps them visible (it
# also overrides a binding that the cluster sets by default); closest, single, map_gpu,
# mask_gpu and per_task would leave a rank one GPU, and every rank but the first without
# its own.
GPU_BINDS = ("none",)
BOOLEANS = {"yes": True, "true": True, "on": True, "1": True, "no": False, "false": False, "off": False, "0": False}
# No %: Slurm reads it as a file-name pattern in the #SBATCH --output path of the logs.
PATH_TEXT = re.compile(r"[A-Za-z0-9._/+@-]+")
PATH_EXPECTED = "a path of letters, digits and ._/+@- (no spaces)"
# [env] names that set the libraries of a run and nothing else: NCCL, UCX, Open MPI (its
# MCA parameters), PMIx (srun --mpi=pmix), libfabric, CUDA and its cuBLAS, cuBLASLt and
# cuDNN, Mellanox's HCOLL, OpenMP, and scalestudy itself. Anything else (PATH, LD_*,
# BASH_ENV, ENV, IFS, PYTHON*, ...) could change which programs a script runs.
ENV_PREFIXES = ("NCCL_", "UCX_", "OMPI_", "PMIX_", "FI_", "CUDA_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "HCOLL_",
                "OMP_", "SCALESTUDY_")
# Of those, the names that say where to find code to load or run (NCCL_NET_PLUGIN,
# FI_PROVIDER_PATH, OMPI_MCA_plm_rsh_agent, OMPI_MCA_mca_base_component_path, ...).
ENV_CODE = re.compile(r"PATH|PLUGIN|AGENT|PRELOAD|LIBRAR|COMMAND|EXEC|SCRIPT", re.I)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Environment modules: names such as cuda/12.4, NVHPC/23.7-CUDA-12.1 or a modulefile's
# path, never starting with '-' (which `module load` would take for an option).
MODULE_NAME = re.compile(r"[A-Za-z0-9._+/][A-Za-z0-9._+/-]*")
MODULE_EXPECTED = "module names of letters, digits and ._+/- (not starting with -), separated by commas"
# A pyxis image: a registry reference ([USER@][REGISTRY#]IMAGE[:TAG], a digest after @),
# docker://..., or a squashfs file; never starting with '-'.
PYXIS_IMAGE = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/:#@+-]*")
# An Apptainer image: a file's absolute path (a .sif) or a URI of a source Apptainer
# pulls from; a relative path would depend on the folder the job starts in.
APPTAINER_IMAGE = re.compile(r"(/|(docker|docker-archive|docker-daemon|oci|oci-archive|library|oras|shub|https?):)"
                             r"[A-Za-z0-9._/:#@+-]*")
ABSOLUTE_PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")
ABSOLUTE_EXPECTED = "an absolute path of letters, digits and ._/+@-"
# Mount flags: pyxis's, joined by + (ro, rw, private, x-create=dir, ...); Apptainer's
# bind options, ro or rw.
PYXIS_MOUNT_FLAGS = re.compile(r"[A-Za-z][A-Za-z0-9_=-]*(\+[A-Za-z][A-Za-z0-9_=-]*)*")
APPTAINER_MOUNT_FLAGS = ("ro", "rw")
# sbatch's --mem: megabytes, or a size with a unit; 0 asks for all of a node's memory.
SLURM_MEMORY = re.compile(r"\d+[KMGT]?")

# The keys of [sweep], each with its default as --help shows it (docs/experiments.md says
# what each does).
SWEEP_KEYS = {
    "name": "the file's stem", "scaling": "strong", "gpus": "1", "strategies": "ddp", "overlap": "off",
    "repeats": "1", "output_dir": "results/<stem>", "backend": "cpu", "bench_comm": "on",
    "gpus_per_node": "1", "ntasks_per_node": "gpus_per_node", "gpu_bind": "none",
    "time_limit": "00:30:00", "cpus_per_task": "1", "mem": "the site's default",
    "exclusive": "yes on cuda, no on cpu", "constraint": "none", "partition": "none", "account": "none",
    "qos": "none", "reservation": "none", "signal_before_limit_s": "60", "srun_args": "--mpi=pmix",
    "modules": "none", "module_purge": "no",
    "container_image": "none (pyxis)", "apptainer_image": "none", "container_mounts": "the output folder's only",
    "container_workdir": "the container's own", "container_binary": "the --binary path",
    "network": "none (the report job writes no predictions)",
    "arrays": "on", "array_throttle": "0 (no limit)",
}


def check_text(where, key, value):
    if CONTROL.search(key) or CONTROL.search(value):
        raise UsageError(f"{where}: {key!r} holds a control character or a line break "
                         f"(continuation lines are not allowed): {value!r}")


def check_form(where, key, value, pattern, expected):
    if not pattern.fullmatch(value):
        raise UsageError(f"{where}: {key} = {value!r}: expected {expected}")


def split_srun_args(where, text):
    try:
        tokens = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"{where}: srun_args = {text!r}: {error}") from None
    for token in tokens:
        check_form(where, "srun_args", token, SRUN_OPTION,
                   "srun options only, each as -x or --name[=value] (e.g. --mpi=pmix)")
    return tuple(tokens)


def check_train_option(where, key, value):
    check_form(where, f"[train] {key}", key, TRAIN_OPTION, "an option name such as global-batch")
    # A value that looks like an option would be read as one; only negative numbers may.
    if value.startswith("-"):
        try:
            float(value)
        except ValueError:
            raise UsageError(f"{where}: [train] {key} = {value!r}: a value may not start "
                             "with '-' unless it is a number") from None


def check_env_name(where, name):
    check_form(where, f"[env] {name}", name, ENV_NAME,
               "a variable name of letters, digits and _, not starting with a digit")
    if not name.startswith(ENV_PREFIXES):
        raise UsageError(f"{where}: [env] {name}: not a library setting; [env] takes names starting with "
                         f"{', '.join(ENV_PREFIXES)} (nothing that changes which programs run)")
    if ENV_CODE.search(name):
        raise UsageError(f"{where}: [env] {name}: names code to load or run, which an experiment file may not set")


def environment(where, parser):
    """[env]: NAME = value pairs, exported as they are written to every rank of every
    point. Nothing is exported that the file does not name: NCCL, for one, keeps its own
    defaults unless [env] sets them."""
    if not parser.has_section("env"):
        return ()
    pairs = tuple(parser["env"].items())
    for name, _ in pairs:
        check_env_name(where, name)
    return pairs


def gpu_counts_of(where, text):
    try:
        return parse_gpu_counts(text)
    except UsageError as error:
        raise UsageError(f"{where}: {error}") from None


def read_experiment(path):
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"EXPERIMENT {path}: no such file")
    # No interpolation: a % is a character of the value, not the start of a reference.
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"), interpolation=None)
    parser.optionxform = str  # train options keep their dashes and case
    try:
        parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"EXPERIMENT {path}: cannot be read as UTF-8 text ({error})") from None
    except configparser.Error as error:
        raise UsageError(f"EXPERIMENT {path}: {error}".splitlines()[0]) from None
    if parser.defaults():
        # Its keys would reach every section, [train] and [env] included.
        raise UsageError(f"EXPERIMENT {path}: [{parser.default_section}] is not a section of an experiment file "
                         "(expected [sweep], [train] and [env])")
    for section in ("sweep", "train"):
        if not parser.has_section(section):
            raise UsageError(f"EXPERIMENT {path}: missing the [{section}] section")
    where = f"EXPERIMENT {path}"
    extra = sorted(set(parser.sections()) - {"sweep", "train", "env"})
    if extra:
        raise UsageError(f"{where}: unknown section [{extra[0]}] (expected [sweep], [train] and [env])")
    sweep = parser["sweep"]
    known = set(SWEEP_KEYS)
    unknown = sorted(set(sweep) - known)
    if unknown:
        spelled = unknown[0].replace("-", "_")
        hint = f" (the [sweep] keys are written with _: {spelled})" if spelled in known else ""
        raise UsageError(f"{where}: unknown key {unknown[0]!r} in [sweep]{hint}")
    for section in parser.sections():
        for key, value in parser[section].items():
            check_text(where, key, value)

    def integer(key, default, minimum=1):
        text = sweep.get(key, str(default))
        if not re.fullmatch(r"\d+", text.strip()):
            raise UsageError(f"{where}: {key} = {text!r} is not a whole number")
        value = int(text)
        if value < minimum:
            raise UsageError(f"{where}: {key} = {value} must be at least {minimum}")
        return value

    def checked(key, default, pattern, expected):
        value = sweep.get(key, default).strip()
        if value:
            check_form(where, key, value, pattern, expected)
        return value

    def boolean(key, default):
        text = sweep.get(key, default).strip().lower()
        if text not in BOOLEANS:
            raise UsageError(f"{where}: {key} = {text!r}: expected yes or no")
        return BOOLEANS[text]

    def choices(key, default, allowed):
        values = split_list(sweep.get(key, default))
        for value in values:
            if value not in allowed:
                raise UsageError(f"EXPERIMENT {path}: {key} = {value} must be one of {', '.join(allowed)}")
        return values

    train = tuple((key, value) for key, value in parser["train"].items())
    for key, value in train:
        check_train_option(where, key, value)
        if key in ("strategy", "overlap", "output", "repeat", "experiment", "backend"):
            raise UsageError(f"EXPERIMENT {path}: [train] {key} is set by the sweep, not the file")
    scalings = choices("scaling", "strong", ("strong", "weak"))
    train_keys = dict(train)
    if "strong" in scalings and "global-batch" not in train_keys:
        raise UsageError(f"EXPERIMENT {path}: strong scaling needs global-batch in [train]")
    if "weak" in scalings and "batch-per-rank" not in train_keys:
        raise UsageError(f"EXPERIMENT {path}: weak scaling needs batch-per-rank in [train]")
    backend = choices("backend", "cpu", ("cpu", "cuda"))[0]
    gpus_per_node = integer("gpus_per_node", 1)
    ntasks_per_node = integer("ntasks_per_node", gpus_per_node)
    if backend == "cuda" and ntasks_per_node > gpus_per_node:
        raise UsageError(f"{where}: ntasks_per_node = {ntasks_per_node} is above gpus_per_node = "
                         f"{gpus_per_node}: on cuda each rank drives a GPU of its own")
    gpu_bind = checked("gpu_bind", "", NAME, "one of " + ", ".join(GPU_BINDS))
    if gpu_bind and gpu_bind not in GPU_BINDS:
        raise UsageError(f"{where}: gpu_bind = {gpu_bind!r}: only {', '.join(GPU_BINDS)}; scalestudy takes "
                         "its local rank's GPU among those a rank sees, so every rank must see all of "
                         "its node's GPUs")
    if gpu_bind and backend != "cuda":
        raise UsageError(f"{where}: gpu_bind = {gpu_bind}: needs backend = cuda")
    output_dir = Path(checked("output_dir", f"results/{path.stem}", PATH_TEXT, PATH_EXPECTED))
    if not output_dir.is_absolute():
        output_dir = ROOT / output_dir
    return Sweep(
        name=checked("name", path.stem, NAME, "letters, digits, '.', '_' and '-'"),
        scalings=scalings,
        gpu_counts=gpu_counts_of(where, sweep.get("gpus", "1")),
        gpus_per_node=gpus_per_node, ntasks_per_node=ntasks_per_node, gpu_bind=gpu_bind,
        # A GPU point's timings are its own only on nodes shared with no other job.
        exclusive=boolean("exclusive", "yes" if backend == "cuda" else "no"),
        constraint=checked("constraint", "", SLURM_CONSTRAINT,
                           "node features of letters, digits and ._- joined by &, | or ,"),
        env=environment(where, parser),
        strategies=choices("strategies", "ddp", ("ddp", "zero2")),
        overlaps=choices("overlap", "off", ("on", "off")),
        repeats=integer("repeats", 1), output_dir=output_dir,
        backend=backend,
        time_limit=checked("time_limit", "00:30:00", SLURM_TIME,
                           "Slurm's time format, e.g. 30, 01:30:00 or 1-12:00:00"),
        cpus_per_task=integer("cpus_per_task", 1),
        srun_args=split_srun_args(where, sweep.get("srun_args", "--mpi=pmix")),
        partition=checked("partition", "", SLURM_NAMES, "partition names separated by commas"),
        account=checked("account", "", NAME, "letters, digits, '.', '_' and '-'"),
        signal_before_limit_s=integer("signal_before_limit_s", 60, minimum=0),
        train=train,
        bench_comm=boolean("bench_comm", "on"),
        qos=checked("qos", "", NAME, "letters, digits, '.', '_' and '-'"),
        reservation=checked("reservation", "", SLURM_NAMES, "reservation names separated by commas"),
        mem=checked("mem", "", SLURM_MEMORY, "megabytes, or a size with a unit K, M, G or T (e.g. 480G); "
                    "0 for all of a node's memory"),
        network=network_file(where, checked("network", "", PATH_TEXT, PATH_EXPECTED)),
        arrays=boolean("arrays", "on"),
        array_throttle=integer("array_throttle", 0, minimum=0),
        modules=listed(where, sweep, "modules", MODULE_NAME, MODULE_EXPECTED),
        module_purge=boolean("module_purge", "no"),
        **container_settings(where, sweep))


def network_file(where, text):
    """The network file's absolute path (a relative one is the repository's, as output_dir
    is), "" for none; a file that is not there is a usage error naming the key."""
    if not text:
        return ""
    path = Path(text) if Path(text).is_absolute() else ROOT / text
    if not path.is_file():
        raise UsageError(f"{where}: network = {text}: no such file (a network description such as "
                         "experiments/networks/ib-ndr-400.ini)")
    return str(path.resolve())


def listed(where, section, key, pattern, expected):
    """A [sweep] list (items separated by commas or spaces), each item of the pattern's form."""
    values = split_list(section.get(key, ""))
    for value in values:
        check_form(where, key, value, pattern, expected)
    return values


def check_mount(where, mount, apptainer):
    parts = mount.split(":")
    if len(parts) not in (2, 3) or not all(ABSOLUTE_PATH.fullmatch(part) for part in parts[:2]):
        raise UsageError(f"{where}: container_mounts = {mount!r}: expected SRC:DST[:FLAGS], SRC and DST "
                         f"each {ABSOLUTE_EXPECTED}, mounts separated by commas")
    if len(parts) == 3:
        if apptainer and parts[2] not in APPTAINER_MOUNT_FLAGS:
            raise UsageError(f"{where}: container_mounts = {mount!r}: Apptainer's bind options are "
                             f"{' or '.join(APPTAINER_MOUNT_FLAGS)}")
        if not apptainer and not PYXIS_MOUNT_FLAGS.fullmatch(parts[2]):
            raise UsageError(f"{where}: container_mounts = {mount!r}: expected pyxis's flags after the second "
                             "':', words such as ro or private joined by +")


def container_settings(where, section):
    """The container keys of [sweep], checked: a pyxis image or an Apptainer one (not
    both), and the mounts, working folder and binary path inside it, which need one."""
    image = section.get("container_image", "").strip()
    apptainer = section.get("apptainer_image", "").strip()
    if image and apptainer:
        raise UsageError(f"{where}: container_image and apptainer_image are both set; a sweep runs in a pyxis "
                         "container (container_image) or an Apptainer one (apptainer_image), not both")
    if image:
        check_form(where, "container_image", image, PYXIS_IMAGE,
                   "an image reference such as nvcr.io#nvidia/pytorch:24.01-py3 or a squashfs file's path "
                   "(letters, digits and ._/:#@+-, not starting with -)")
    if apptainer:
        check_form(where, "apptainer_image", apptainer, APPTAINER_IMAGE,
                   "a .sif file's absolute path, or a URI such as docker://nvcr.io/nvidia/pytorch:24.01-py3 "
                   "(letters, digits and ._/:#@+-)")
    for key in ("container_mounts", "container_workdir", "container_binary"):
        if section.get(key, "").strip() and not (image or apptainer):
            raise UsageError(f"{where}: {key} needs a container: container_image (pyxis) or apptainer_image")
    mounts = split_list(section.get("container_mounts", ""))
    for mount in mounts:
        check_mount(where, mount, bool(apptainer))
    paths = {}
    for key in ("container_workdir", "container_binary"):
        paths[key] = section.get(key, "").strip()
        if paths[key]:
            check_form(where, key, paths[key], ABSOLUTE_PATH,
                       f"{ABSOLUTE_EXPECTED} (a path inside the container)")
    return dict(container_image=image, apptainer_image=apptainer, container_mounts=mounts, **paths)


def plan(sweep):
    """The training points: one per (scaling, strategy, overlap, GPU count, repeat)."""
    points = []
    for scaling in sweep.scalings:
        for strategy in sweep.strategies:
            for overlap in sweep.overlaps:
                for ranks in sweep.gpu_counts:
                    for repeat in range(sweep.repeats):
                        result = (sweep.output_dir / scaling / f"{strategy}-overlap_{overlap}"
                                  / f"n{ranks}-r{repeat}.h5")
                        points.append(Point(scaling, strategy, overlap, ranks, repeat, result))
    return points


BENCH_COMM_FOLDER = "bench-comm"


def bench_comm_points(sweep):
    """The sweep's bench comm point, at its largest GPU count, as a list: empty with
    bench_comm = off, or where that count is one rank (no collective to measure)."""
    ranks = max(sweep.gpu_counts)
    if not sweep.bench_comm or ranks < 2:
        return []
    return [BenchCommPoint(ranks, sweep.output_dir / BENCH_COMM_FOLDER / f"n{ranks}.h5")]


def nodes_for(sweep, point):
    return math.ceil(point.ranks / sweep.ntasks_per_node)


def ranks_per_node(sweep, point):
    return min(point.ranks, sweep.ntasks_per_node)


def train_arguments(sweep, point):
    """The point's `scalestudy train` arguments. A point runs only when its result is not
    complete, so whatever is at its path (a failed or unreadable file) is replaced."""
    args = ["train", "--experiment", sweep.name, "--repeat", str(point.repeat),
            "--strategy", point.strategy, "--overlap", point.overlap, "--backend", sweep.backend,
            "--output", str(point.result), "--overwrite"]
    for key, value in sweep.train:
        if key == "global-batch" and point.scaling != "strong":
            continue
        if key == "batch-per-rank" and point.scaling != "weak":
            continue
        args += [f"--{key}", value]
    return args


# bench comm over every rank, each node's ranks and one rank per node; the binary leaves
# out a scope whose communicator has one rank.
BENCH_COMM_SCOPES = "world,intra_node,inter_node"
# On the cpu backend: payloads from 1 KiB to 1 MiB (the tiny model's gradients, 118 KB,
# lie inside), one warm-up and three timed samples of at least 0.2 ms each: a few
# seconds. On cuda, the binary's own sizes (to 1 GiB) and samples.
BENCH_COMM_CPU = ("--max-bytes", "1M", "--warmup", "1", "--repeats", "3", "--min-sample-ms", "0.2")
# The [train] options bench comm shares with train: the links the collectives take, and
# how long one may wait.
BENCH_COMM_SHARED = ("link-emulation", "comm-timeout")


def bench_comm_arguments(sweep, point):
    """The bench comm point's `scalestudy bench comm` arguments; like a training point's
    run, it replaces whatever is at its path."""
    args = ["bench", "comm", "--backend", sweep.backend, "--scopes", BENCH_COMM_SCOPES,
            "--output", str(point.result), "--overwrite"]
    if sweep.backend == "cpu":
        args += BENCH_COMM_CPU
    for key, value in sweep.train:
        if key in BENCH_COMM_SHARED:
            args += [f"--{key}", value]
    return args


def point_arguments(sweep, point):
    """The binary's arguments of a point, training or bench comm."""
    if isinstance(point, BenchCommPoint):
        return bench_comm_arguments(sweep, point)
    return train_arguments(sweep, point)


def bench_comm_scopes(sweep, point):
    """The scopes bench comm measures at the point's placement: those whose communicator
    has two ranks or more."""
    nodes, per_node = nodes_for(sweep, point), ranks_per_node(sweep, point)
    return [scope for scope, ranks in (("world", point.ranks), ("intra_node", per_node), ("inter_node", nodes))
            if ranks >= 2]


def read_back(path):
    """(status, why): the status attribute of the file at `path`, and, for a file marked
    complete, whether every dataset in it reads back. A file that does not read back
    (cut short, written by two runs at once, its disk full) is 'unreadable', whatever its
    root says, and `why` says what failed; its point runs again."""
    try:
        import h5py
    except ImportError:
        return read_back_with_h5dump(path)
    try:
        with h5py.File(path, "r") as handle:
            status = handle.attrs.get("status", "unknown")
            status = status.decode() if isinstance(status, bytes) else str(status)
            if status != "complete":
                return status, ""
            datasets = []
            handle.visititems(lambda name, item: datasets.append(name) if isinstance(item, h5py.Dataset) else None)
            if not datasets:
                return "unreadable", "marked complete but holds no dataset"
            for name in datasets:
                handle[name][()]
    except Exception as error:  # h5py raises OSError, KeyError, RuntimeError or ValueError by HDF5's error
        return "unreadable", f"{type(error).__name__}: {error}".splitlines()[0]
    return "complete", ""


def read_back_with_h5dump(path):
    dump = subprocess.run(["h5dump", "-a", "/status", str(path)], capture_output=True, text=True)
    match = re.search(r'\(0\): "(\w+)"', dump.stdout)
    if not match:
        return "unreadable", (dump.stderr.strip().splitlines() or ["h5dump read no status"])[0]
    if match.group(1) != "complete":
        return match.group(1), ""
    whole = subprocess.run(["h5dump", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if whole.returncode != 0:
        return "unreadable", (whole.stderr.strip().splitlines() or ["h5dump failed"])[0]
    return "complete", ""


def result_status(path):
    """'complete' (marked so, and every dataset reads back), 'failed', 'running',
    'unreadable' or 'missing'."""
    return result_state(path)[0]


def result_state(path):
    """(status as result_status gives it, why the file does not read back or "")."""
    if not path.exists():
        return ("running" if Path(str(path) + ".partial").exists() else "missing"), ""
    return read_back(path)


def status_text(path):
    status, why = result_state(path)
    return f"{status}: {why}" if why else status


def print_plan(sweep, points):
    print(f"sweep {sweep.name}: {len(points)} point(s), results in {sweep.output_dir}")
    for index, point in enumerate(points, 1):
        if isinstance(point, BenchCommPoint):
            what, which = f"{'bench comm':24s}", f"scopes={','.join(bench_comm_scopes(sweep, point))}"
        else:
            what = f"{point.scaling:6s} {point.strategy:5s} overlap={point.overlap:3s}"
            which = f"repeat={point.repeat}"
        print(f"  {index:3d}/{len(points)}  {what} ranks={point.ranks:<3d} nodes={nodes_for(sweep, point):<3d} "
              f"{which}  {point.result}  [{status_text(point.result)}]")
    if sweep.bench_comm and not any(isinstance(point, BenchCommPoint) for point in points):
        print("  no bench comm point: the largest point has one rank, no collective to measure")


def report_command(sweep):
    return [sys.executable, "-m", "scalestudy_analysis.report.cli", str(sweep.output_dir), "-o",
            str(sweep.output_dir / "report")]


def prediction_command(sweep):
    """scalestudy-predict on the sweep's results for its network file, writing into
    <output_dir>/prediction, beside the report; None where the experiment names no network."""
    if not sweep.network:
        return None
    return [sys.executable, "-m", "scalestudy_analysis.predict.cli", str(sweep.output_dir), "--network",
            sweep.network, "--out", str(sweep.output_dir / "prediction")]


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


def container_mounts_of(sweep):
    """The container's mounts: the output folder at its own path, where the ranks write
    their result files (unless a writable mount of the experiment's already holds it there),
    then the experiment's."""
    def holds_output(mount):
        source, destination, *flags = mount.split(":")
        return (source == destination and "ro" not in "+".join(flags).split("+")
                and sweep.output_dir.is_relative_to(Path(source)))

    if any(holds_output(mount) for mount in sweep.container_mounts):
        return list(sweep.container_mounts)
    return [f"{sweep.output_dir}:{sweep.output_dir}"] + list(sweep.container_mounts)


def pyxis_options(sweep):
    """srun's options that run every rank in the pyxis image; none without one."""
    if not sweep.container_image:
        return []
    options = [f"--container-image={sweep.container_image}",
               f"--container-mounts={','.join(container_mounts_of(sweep))}"]
    if sweep.container_workdir:
        options.append(f"--container-workdir={sweep.container_workdir}")
    return options


def rank_command(sweep, binary):
    """What each rank runs before its arguments: the binary, or `apptainer exec` running
    it in the Apptainer image (with the GPUs, --nv, on cuda)."""
    if not sweep.apptainer_image:
        return [str(binary)]
    command = ["apptainer", "exec"] + (["--nv"] if sweep.backend == "cuda" else [])
    command += ["--bind", ",".join(container_mounts_of(sweep))]
    if sweep.container_workdir:
        command += ["--pwd", sweep.container_workdir]
    return command + [sweep.apptainer_image, str(binary)]


def local_command(sweep, point, binary, mpirun):
    """The mpirun command of one point; [env] reaches every rank through -x."""
    # Unbound: a rank's host threads (the comm thread, NCCL's proxy) must not share one core.
    command = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(point.ranks)]
    for name, value in sweep.env:
        command += ["-x", f"{name}={value}"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command + rank_command(sweep, binary) + point_arguments(sweep, point)


def pending_points(points):
    """The points whose result is not complete. A file that says complete but does not
    read back is redone, and the sweep says so."""
    pending = []
    for point in points:
        status, why = result_state(point.result)
        if status == "unreadable":
            print(f"{point.label()}: {point.result} does not read back ({why}); running it again")
        if status != "complete":
            pending.append(point)
    return pending


class Stopped(BaseException):
    """SIGINT or SIGTERM reached the sweep. Not an Exception, so that no handler of errors
    (an HDF5 read's, for one) takes it for one."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum, frame):
    # A second signal while the first is handled must not cut the handling short.
    for handled in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handled, signal.SIG_IGN)
    raise Stopped(signum)


def become_subreaper():
    """Ranks whose mpirun ends before them are handed to this process, not to init, so
    that they stay among its descendants and a stop reaches them (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(root_pid):
    """Every live process below root_pid, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root_pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def send(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def reap_orphans():
    """Collects the exit status of ranks handed to this process (become_subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# A stopped rank ends its step, marks its file failed and exits; this long is given it,
# and then the launcher as long again to end on its own before it is signalled, and
# everything left is killed a second later (the ranks are gone well within 10 s).
RANKS_STOP_S = 6.0
LAUNCHER_STOP_S = 1.0


def wait_while(condition, seconds):
    deadline = time.monotonic() + seconds
    while condition() and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.05)


def stop_descendants(signum, launcher_pid):
    """Forwards signum to every process below this one but the launcher, also to ranks
    started while this runs, and waits for them. mpirun is signalled only if it has not
    ended once its ranks have: signalled, it kills its ranks at once (before they could
    mark their file failed), and signalled again while it aborts, it can crash. Whatever
    is left then is killed."""
    me = os.getpid()
    signalled = set()

    def ranks_left():
        ranks = [pid for pid in descendants(me) if pid != launcher_pid]
        for pid in ranks:
            if pid not in signalled:
                send(pid, signum)
                signalled.add(pid)
        return ranks

    wait_while(ranks_left, RANKS_STOP_S)
    if launcher_pid:
        launcher_alive = lambda: launcher_pid in descendants(me)  # noqa: E731
        wait_while(launcher_alive, LAUNCHER_STOP_S)
        if launcher_alive():
            try:
                os.killpg(launcher_pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            wait_while(lambda: descendants(me), LAUNCHER_STOP_S)
    for pid in descendants(me):
        send(pid, signal.SIGKILL)
    reap_orphans()


def run_point(command, log, env=None, mode="w"):
    """Runs one point's launcher in a session of its own (so that a Ctrl-C at the terminal
    reaches the sweep alone, which then stops the point's ranks before the launcher), in
    `env` (default: this process's environment), its output written to `log` (opened with
    `mode`: "a" adds to it); returns its exit status."""
    with open(log, mode) as out:
        out.write(shlex.join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=env)
        try:
            return process.wait()
        except Stopped as stop:
            stop_descendants(stop.signum, process.pid)
            process.wait()
            raise


def report_after_points(sweep):
    """Writes the report and says where it is, once: the report's own stdout, which is
    that path, is left out."""
    print(f"writing the report: {shlex.join(report_command(sweep))}")
    code = run_report(sweep)
    if code == 0:
        print(f"report: {sweep.output_dir / 'report' / 'report.md'}")
    else:
        print(f"the report did not complete (exit {code}); its messages are above", file=sys.stderr)
    return code


def run_report(sweep):
    """Writes the report, in a session of its own: a Ctrl-C at the terminal reaches the
    sweep alone, which ends the report with SIGTERM (quietly, where SIGINT would print
    Python's traceback)."""
    process = subprocess.Popen(report_command(sweep), start_new_session=True,
                               stdout=subprocess.DEVNULL)
    try:
        return process.wait()
    except Stopped:
        send(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=LAUNCHER_STOP_S)
        except subprocess.TimeoutExpired:
            send(process.pid, signal.SIGKILL)
        raise


def run_local(sweep, points, binary, mpirun, env=None):
    """Runs the pending points one after another, each launcher in `env` (default: this
    process's environment); returns the points that did not complete."""
    become_subreaper()
    pending = pending_points(points)
    print(f"sweep {sweep.name}: {len(points) - len(pending)} of {len(points)} point(s) already complete")
    failures = []
    for index, point in enumerate(pending, 1):
        point.result.parent.mkdir(parents=True, exist_ok=True)
        log = point.result.with_suffix(".log")
        command = local_command(sweep, point, binary, mpirun)
        print(f"[{index}/{len(pending)}] {point.label()} ... ", end="", flush=True)
        started = time.monotonic()
        try:
            before = result_files(point.result)
            code = run_point(command, log, env)
            if start_failed(code, before, result_files(point.result)):
                with open(log, "a") as out:
                    out.write(start_retry_line(point, code) + "\n")
                print("started once more (the launch ended before the run created its result file) ... ",
                      end="", flush=True)
                code = run_point(command, log, env, mode="a")
        except Stopped as stop:
            print(flush=True)
            stop.point = point
            raise
        seconds = time.monotonic() - started
        status = status_text(point.result)
        print(f"{status} in {seconds:.1f} s (log {log})")
        if code != 0 or status != "complete":
            failures.append(point)
    return failures


# The start-up retry. Open MPI 4.1's MPI_Init can take a peer's first message before its
# PML has registered the handler, and the rank dies with SIGSEGV inside MPI_Init (about one
# start in 150 of a two-node job). A launch that ends non-zero, and not with exit status 2
# (bad input, which the same arguments meet again), while neither the result file nor its
# .partial has been created or replaced, ended before the run began to write: it starts
# once more, once, with a line in the point's log saying why.
START_RETRY_CAUSE = "the job ended before the run created its result file, as a crash inside MPI_Init does"


def result_files(result):
    """What lies at a point's result path and its .partial: (inode, size, mtime) of each,
    None where there is none. A run that has begun writing changes one of them."""
    found = []
    for path in (result, Path(str(result) + ".partial")):
        try:
            info = os.stat(path)
            found.append((info.st_ino, info.st_size, info.st_mtime_ns))
        except FileNotFoundError:
            found.append(None)
    return tuple(found)


def start_failed(code, before, after):
    """Whether a launch that ended with `code` ended before its run created its result
    file (so that it is started once more)."""
    return code != 0 and code != USAGE_ERROR and before == after


def start_retry_line(point, code):
    return f"scalestudy: {point.label()}: the launch ended with exit status {code}: {START_RETRY_CAUSE}; starting it once more"


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


# ---- what Slurm says happened: the manifest of submitted jobs, their states, the resume ----

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
    "script_sha256"}}, "report": job id}; empty where nothing was submitted."""
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


def record_submitted(sweep, submitted, report_id):
    """Adds the points just submitted ({label: entry}) and the report's job to the
    manifest, atomically."""
    manifest = read_manifest(sweep)
    manifest["points"].update(submitted)
    if report_id:
        manifest["report"] = report_id
    write_atomically(manifest_path(sweep), json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def job_log(sweep, point, job_id):
    """The log Slurm writes for a point's job (#SBATCH --output, %x-%j)."""
    return sweep.output_dir / "logs" / f"{sweep.name}-{point.label()}-{job_id}.out"


def show_status(sweep, points):
    """Prints every point with its result file's state, its job's state where the sweep
    submitted it, and what a resume does with it."""
    manifest = read_manifest(sweep)
    answers = point_verdicts(sweep, points)
    print(f"sweep {sweep.name}: {len(points)} point(s), results in {sweep.output_dir}")
    width = max(len(point.label()) for point in points)
    for point, entry, job, said in answers:
        job_text = f"job {entry['job']} {job.text()}" if entry else "not submitted"
        action = {"complete": "done", "waiting": "waiting", "held": "not rerun", "rerun": "rerun"}[said.action]
        why = f" ({said.why})" if said.why and said.action != "waiting" else ""
        print(f"  {point.label():{width}s}  {result_description(point.result)}  [{job_text}]  resume: {action}{why}")
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
    message."""
    command = [str(binary)] + train_arguments(sweep, point) + ["--check", "--check-ranks", str(point.ranks)]
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
        failures = run_local(sweep, points, binary, args.mpirun, env)
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
