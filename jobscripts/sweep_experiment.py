"""The experiment file: the sweep it declares (Sweep), the form each value of it must have
(every value ends up in a shell script), the keys of [sweep] with their defaults, and
read_experiment, which reads the file and checks it."""
import configparser
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from script_cli import UsageError


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
    gemm_search: bool = False  # a `scalestudy gemm-search` per micro-batch before the points, read by every point

    def containerised(self):
        return bool(self.container_image or self.apptainer_image)


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
    "arrays": "on", "array_throttle": "0 (no limit)", "gemm_search": "off",
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
        gemm_search=gemm_search_setting(where, boolean("gemm_search", "off"), backend, train_keys),
        **container_settings(where, sweep))


# The [train] precisions of cuda's 16-bit GEMMs, which a choice file serves (auto is bf16).
SEARCHED_PRECISIONS = ("bf16", "fp16", "auto")


def gemm_search_setting(where, on, backend, train):
    """gemm_search, checked: on needs the cuda backend, a 16-bit precision and the model
    named in [train] (the search's --model), and the sweep's own choice file in place of
    [train]'s gemm-algos-file."""
    if not on:
        return False
    precision = train.get("precision", "auto")
    if backend != "cuda":
        why = f"needs backend = cuda (the search times cuBLASLt's GEMMs), not {backend}"
    elif precision not in SEARCHED_PRECISIONS:
        why = f"needs a 16-bit [train] precision (bf16 or fp16; auto is bf16), not {precision}"
    elif "gemm-algos-file" in train:
        why = ("conflicts with [train] gemm-algos-file: the sweep's points read the file the searches write, "
               "<output_dir>/gemm-algos.txt; leave one of the two out")
    elif "model" not in train:
        why = "needs model in [train], the model the search runs a step of"
    else:
        return True
    raise UsageError(f"{where}: gemm_search = on: {why}")


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
