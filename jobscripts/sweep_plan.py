"""The points of a sweep: which points it plans (training and bench comm), how they are
placed on nodes, the binary's arguments and the command each rank runs, the GEMM searches
that run before the training points (gemm_search = on), the commands of the report and the
predictions, the state of a point's result file, which decides whether the point runs
(again) and whether a launch that failed is started once more, and the dry run's listing
of the points with those states."""
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from script_cli import USAGE_ERROR, UsageError


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


@dataclass(frozen=True)
class GemmSearch:
    """One `scalestudy gemm-search` of the sweep: the GEMMs of a training step at
    `micro_batch`, and with `reserve` above 0 also those sized for the multiprocessors an
    overlapped lane of that many CTAs leaves, chosen into `output`, the sweep's choice file."""
    micro_batch: int
    reserve: int
    output: Path

    def label(self):
        return f"gemm-search-b{self.micro_batch}"


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
    if sweep.gemm_search:
        args += ["--gemm-algos-file", str(gemm_algos_file(sweep))]
    return args


# ---- the GEMM searches (gemm_search = on) ----------------------------------------------

GEMM_ALGOS_FILE = "gemm-algos.txt"
# The overlapped lane's CTAs where [train] leaves overlapped-ctas to auto (train's auto, on
# cuda with overlap on).
AUTO_OVERLAPPED_CTAS = 4
# The [train] options that give the search the points' GEMMs: the model (with its
# vocabulary, the LM head's shapes), the precision and the attention kernel (whose output
# rows the projections' GEMMs read at its stride).
SEARCH_OPTIONS = ("model", "layers", "hidden", "heads", "vocab", "precision", "attention-kernel")


def gemm_algos_file(sweep):
    """The sweep's choice file: the searches write it, every training point reads it."""
    return sweep.output_dir / GEMM_ALGOS_FILE


def micro_batch(sweep, point):
    """The micro-batch a training point's ranks run: the batch per rank (global-batch split
    over the ranks in strong scaling, batch-per-rank in weak) over grad-accum."""
    key = "global-batch" if point.scaling == "strong" else "batch-per-rank"
    ranks = point.ranks if point.scaling == "strong" else 1
    train = dict(sweep.train)
    try:
        batch, accumulation = int(train[key]), int(train.get("grad-accum", "1"))
    except ValueError:
        batch = accumulation = 0
    if batch < 1 or accumulation < 1 or batch % (ranks * accumulation):
        raise UsageError(f"{point.label()}: [train] {key} = {train[key]} and grad-accum = "
                         f"{train.get('grad-accum', '1')} give its {point.ranks} rank(s) no whole micro-batch "
                         "to search the GEMMs of (gemm_search = on)")
    return batch // (ranks * accumulation)


def lane_reserve(sweep, point):
    """The CTAs of the overlapped lane beside a training point's backward GEMMs: with
    overlap on and two ranks or more, [train]'s overlapped-ctas (auto: 4); else 0."""
    if point.overlap != "on" or point.ranks < 2:
        return 0
    ctas = dict(sweep.train).get("overlapped-ctas", "auto")
    return int(ctas) if ctas.isdigit() else AUTO_OVERLAPPED_CTAS


def gemm_searches(sweep, points):
    """The GEMM searches the training points among `points` need, none with gemm_search =
    off: one per micro-batch, with the largest lane any of its points runs beside (a search
    with a reserve chooses for the whole device's sizing too), by micro-batch."""
    if not sweep.gemm_search:
        return []
    reserves = {}
    for point in points:
        if isinstance(point, Point):
            batch = micro_batch(sweep, point)
            reserves[batch] = max(reserves.get(batch, 0), lane_reserve(sweep, point))
    return [GemmSearch(batch, reserve, gemm_algos_file(sweep)) for batch, reserve in sorted(reserves.items())]


def gemm_search_arguments(sweep, search):
    """The search's `scalestudy gemm-search` arguments: the points' model, vocabulary,
    precision, attention kernel and sequence length ([train]'s seq, else its max-seq,
    train's default seq)."""
    train = dict(sweep.train)
    args = ["gemm-search", "--backend", "cuda"]
    for key in SEARCH_OPTIONS:
        if key in train:
            args += [f"--{key}", train[key]]
    seq = train.get("seq", train.get("max-seq"))
    if seq:
        args += ["--seq", seq]
    args += ["--micro-batch", str(search.micro_batch)] + (["--reserve", str(search.reserve)] if search.reserve else [])
    return args + ["--gemm-algos-file", str(search.output)]


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


def print_plan(sweep, points):
    print(f"sweep {sweep.name}: {len(points)} point(s), results in {sweep.output_dir}")
    pending = []
    for index, point in enumerate(points, 1):
        if isinstance(point, BenchCommPoint):
            what, which = f"{'bench comm':24s}", f"scopes={','.join(bench_comm_scopes(sweep, point))}"
        else:
            what = f"{point.scaling:6s} {point.strategy:5s} overlap={point.overlap:3s}"
            which = f"repeat={point.repeat}"
        status = status_text(point.result)
        if status != "complete":
            pending.append(point)
        print(f"  {index:3d}/{len(points)}  {what} ranks={point.ranks:<3d} nodes={nodes_for(sweep, point):<3d} "
              f"{which}  {point.result}  [{status}]")
    if sweep.bench_comm and not any(isinstance(point, BenchCommPoint) for point in points):
        print("  no bench comm point: the largest point has one rank, no collective to measure")
    if sweep.gemm_search:
        print_searches(gemm_searches(sweep, pending), gemm_algos_file(sweep))


def print_searches(searches, path):
    """The dry run's lines of the GEMM searches that run before the points not complete."""
    if not searches:
        print("  no GEMM search: every training point is complete")
        return
    print(f"  before the training points, {len(searches)} GEMM search(es) into {path}:")
    for search in searches:
        print(f"    {search.label()}  micro-batch={search.micro_batch} reserve={search.reserve}")


# The start-up retry. Open MPI 4.1's MPI_Init can take a peer's first message before its
# PML has registered the handler, and the rank dies with SIGSEGV inside MPI_Init (about one
# start in 150 of a two-node job). A launch that ends non-zero, and not with exit status 2
# (bad input, which the same arguments meet again), while neither the result file nor its
# .partial has been created or replaced, ended before the run began to write: it starts
# once more, once, with a line in the point's log saying why.
# The local launcher applies the rule through start_failed, and every sbatch script through
# the same test in shell (sweep_slurm's retried_launch_lines): the two must agree.
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
