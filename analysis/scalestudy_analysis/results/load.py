"""Reading result files (schema v1 to v8) into RunRecords and one pandas row per run.

A file that does not read back (HDF5 cannot open an object or read its values, as in a
file two runs wrote at once) counts as failed: it is left out of every number, named
under Problems, and named with HDF5's error in one warning line on stderr, so that no
consumer drops it without a word."""
import errno
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from scalestudy_analysis.results import machine
from scalestudy_analysis.results.gpu_state import GpuState, read_gpu_phase_state, read_gpu_state
from scalestudy_analysis.results.intervals import StepQuantities, step_quantities
from scalestudy_analysis.results.kernel_trace import KernelTrace, read_kernel_trace
from scalestudy_analysis.results.placement import read_placement
from scalestudy_analysis.results.reading import Problem, attributes as _attributes, text as _text, text_list as _text_list
from scalestudy_analysis.results.schema import (COLLECTIVE_NAMES, HOST_INFO_DATASETS, HOST_INFO_VERSION, KERNEL_TRACE_GROUP,
                     MEMORY_ESTIMATE_ATTRIBUTE, PHASE_NAMES, RESULT_SUFFIXES, STATUS_COMPLETE,
                     SUMMARY_FLOAT_KEYS, SUPPORTED_SCHEMA_VERSIONS)
from scalestudy_analysis.results.summary import compare_summary, compute_summary


class MissingField(Exception):
    """The file lacks something the schema requires; the message names it."""


# What h5py raises where a file does not read back: a header or B-tree it cannot decode
# (OSError, KeyError, RuntimeError), values of the wrong kind (ValueError, TypeError), or a
# corrupt dataspace whose size no memory holds (MemoryError).
READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError, MemoryError)


@dataclass
class RunRecord:
    """One result file as read and checked: attributes, config, per-rank provenance, the
    /steps arrays (times in seconds), collectives, memory (bytes), kernel trace, GPU state,
    recomputed summary and problems; usable: it enters the numbers."""
    path: str
    attrs: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    hostnames: list = field(default_factory=list)
    devices: list = field(default_factory=list)
    logical_cores: np.ndarray = None    # [R] the host's logical cores (version 5); None before
    cpu_binding: list = None            # [R] each rank's CPU list, e.g. "0-3" (version 5)
    cpu_model: list = None              # [R] the host's CPU model (version 5)
    node_index: np.ndarray = None       # [R] the rank's node (version 5; MPI's from version 7)
    local_rank: np.ndarray = None       # [R] the rank among its node's (version 5)
    device_uuid: list = None            # [R] "GPU-...", "" on the cpu (version 7)
    device_pci_bus_id: list = None      # [R] "00000000:19:00.0", "" on the cpu (version 7)
    rank_transports: list = None        # [R] NCCL's transports, "P2P", "NET/Socket" (version 8)
    intervals: np.ndarray = None        # [S, R, P, 2]
    loss: np.ndarray = None
    tokens: np.ndarray = None
    warmup: np.ndarray = None
    traced: np.ndarray = None           # all 0 in version 1 files, which predate tracing
    step_index: np.ndarray = None
    comm_bytes: np.ndarray = None       # [S, K]
    collectives: dict = field(default_factory=dict)  # name -> [C] array, step mapped to row
    memory_bytes: np.ndarray = None     # [R, M]
    peak_bytes: np.ndarray = None
    peak_bytes_source: str = ""         # /memory/peak_bytes' peak_source: VmHWM, cudaMemGetInfo
    kernel_trace: KernelTrace = None    # None without /kernel_trace or when it is malformed
    kernel_trace_found: bool = False    # the group exists, even when it proved malformed
    gpu_state: GpuState = None          # /steps/gpu_*; None before version 3, missing or malformed
                                        # (its .phases: /steps/gpu_phase_*, version 4)
    stored_summary: dict = field(default_factory=dict)
    quantities: StepQuantities = None
    summary: dict = field(default_factory=dict)   # recomputed by the analysis
    problems: list = field(default_factory=list)
    usable: bool = False
    read_error: str = ""                # why the file does not read back; "" when it does

    # A file that does not read back counts as failed, whatever its root says.
    status = property(lambda self: "failed" if self.read_error
                      else self.attrs.get("status", "unreadable"))
    world_size = property(lambda self: int(self.attrs.get("world_size", -1)))
    git_sha = property(lambda self: self.attrs.get("git_sha", ""))
    repeat = property(lambda self: self.config.get("repeat", ""))
    schema_version = property(lambda self: int(self.attrs.get("schema_version", -1)))

    @property
    def memory_estimate_bytes(self):
        """The memory preflight's estimate of rank 0's bytes (version 6), or NaN."""
        value = self.attrs.get(MEMORY_ESTIMATE_ATTRIBUTE)
        return float(value) if value is not None else np.nan

    @property
    def measured(self):
        # Traced steps are slowed by the tracing itself, so like warm-up they are kept
        # out of every timing (docs/results-schema.md, /summary).
        return (self.warmup == 0) & (self.traced == 0)

    def measured_step_times(self):
        return self.quantities.step_time[self.measured]


def _dataset(handle, path, dtype=None):
    if path not in handle:
        raise MissingField(f"missing {path}")
    data = handle[path]
    if data.dtype.kind in "OS":
        return np.array(data.asstr()[()], dtype=object)
    values = data[()]
    return values.astype(dtype) if dtype is not None else values


def _check_names(handle, path, attribute, expected):
    if path not in handle or attribute not in handle[path].attrs:
        raise MissingField(f"missing attribute {attribute} on {path}")
    names = _text_list(handle[path].attrs[attribute])
    if tuple(names) != tuple(expected):
        raise MissingField(f"{path} {attribute} is {names}, expected {list(expected)}")


def _open(path):
    # Files of running jobs are open for writing elsewhere; reading them must not fail
    # on HDF5's advisory lock.
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:
        return h5py.File(path, "r")


def _read_steps(handle, run):
    _check_names(handle, "/steps", "phase_names", PHASE_NAMES)
    run.intervals = _dataset(handle, "/steps/intervals", np.float64)
    run.loss = _dataset(handle, "/steps/loss", np.float64)
    run.tokens = _dataset(handle, "/steps/tokens", np.int64)
    run.warmup = _dataset(handle, "/steps/warmup", np.uint8)
    _read_traced(handle, run)
    run.step_index = _dataset(handle, "/steps/step_index", np.int64)
    run.comm_bytes = _dataset(handle, "/steps/comm_bytes", np.int64)
    _check_names(handle, "/steps/comm_bytes", "collective_names", COLLECTIVE_NAMES)
    n_steps = run.intervals.shape[0]
    if len(run.hostnames) != run.world_size:
        raise MissingField(f"/ranks/hostname has {len(run.hostnames)} entries, world_size is "
                           f"{run.world_size}")
    if run.intervals.ndim != 4 or run.intervals.shape[1:] != (run.world_size, len(PHASE_NAMES), 2):
        raise MissingField(f"/steps/intervals has shape {run.intervals.shape}, expected "
                           f"[S, {run.world_size}, {len(PHASE_NAMES)}, 2]")
    for name in ("loss", "tokens", "warmup", "traced", "step_index"):
        if getattr(run, name).shape != (n_steps,):
            raise MissingField(f"/steps/{name} has shape {getattr(run, name).shape}, "
                               f"expected [{n_steps}] like /steps/intervals")


def _read_traced(handle, run):
    if "/steps/traced" in handle:
        run.traced = _dataset(handle, "/steps/traced", np.uint8)
        return
    # Version 1 predates tracing. A later file without it is read the same way, but
    # named: its summary would count traced steps if there were any.
    run.traced = np.zeros(run.warmup.shape, dtype=np.uint8)
    if run.schema_version >= 2:
        run.problems.append(Problem(run.path, "missing field", "no /steps/traced in a schema "
                                    f"version {run.schema_version} file; read as no traced "
                                    "steps", False))


def _read_collectives(handle, run):
    columns = {}
    for name in ("step", "rank", "kind", "phase", "begin", "end", "payload_bytes"):
        columns[name] = _dataset(handle, f"/collectives/{name}")
    # When compute waited for each collective; NaN where it never did.
    for name in ("wait_begin", "wait_end"):
        if f"/collectives/{name}" in handle:
            columns[name] = _dataset(handle, f"/collectives/{name}")
        else:
            columns[name] = np.full(columns["step"].shape, np.nan)
    lengths = {values.shape for values in columns.values()}
    if len(lengths) != 1:
        raise MissingField(f"/collectives datasets differ in length: {sorted(lengths)}")
    for name, count in (("rank", run.world_size), ("kind", len(COLLECTIVE_NAMES)),
                        ("phase", len(PHASE_NAMES))):
        outside = int(((columns[name] < 0) | (columns[name] >= count)).sum())
        if outside:
            raise MissingField(f"/collectives/{name} holds {outside} values outside [0, {count})")
    steps = columns["step"]
    order = np.argsort(run.step_index, kind="stable")
    sorted_index = run.step_index[order]
    if sorted_index.size:
        position = np.minimum(np.searchsorted(sorted_index, steps), sorted_index.size - 1)
        known = sorted_index[position] == steps
    else:
        position = np.zeros(steps.shape, dtype=np.int64)
        known = np.zeros(steps.shape, dtype=bool)
    unknown = int((~known).sum())
    if unknown and run.status == STATUS_COMPLETE:
        run.problems.append(Problem(run.path, "collectives", f"{unknown} rows of /collectives "
                                    "name steps missing from /steps; ignored", False))
    columns = {name: values[known] for name, values in columns.items()}
    columns["row"] = order[position[known]]
    run.collectives = columns


def _read_host_info(handle, run):
    """The host's logical cores, each rank's CPU binding and the CPU model (version 5).
    Older files lack them and read as unknown; a version 5 file without them, or with
    the wrong length, is named and read the same way."""
    missing, found = [], {}
    for name in HOST_INFO_DATASETS:
        path = f"/ranks/{name}"
        if path not in handle:
            missing.append(path)
            continue
        values = _dataset(handle, path)
        if np.shape(values) != (run.world_size,):
            missing.append(f"{path} (shape {np.shape(values)}, expected [{run.world_size}])")
            continue
        found[name] = values
    if "logical_cores" in found:
        run.logical_cores = np.asarray(found["logical_cores"], dtype=np.float64)
    if "cpu_binding" in found:
        run.cpu_binding = [str(value) for value in found["cpu_binding"]]
    if "cpu_model" in found:
        run.cpu_model = [str(value) for value in found["cpu_model"]]
    if missing and run.schema_version >= HOST_INFO_VERSION:
        run.problems.append(Problem(run.path, "missing field", ", ".join(missing) + " in a "
                                    f"schema version {run.schema_version} file; read as "
                                    "unknown", False))


def _read_body(handle, run):
    if "/config" not in handle:
        raise MissingField("missing /config")
    run.config = {key: str(value) for key, value in _attributes(handle["/config"]).items()}
    run.hostnames = list(_dataset(handle, "/ranks/hostname"))
    run.devices = list(_dataset(handle, "/ranks/device"))
    _read_host_info(handle, run)
    run.problems.extend(read_placement(handle, run))
    _read_steps(handle, run)
    run.gpu_state, problems = read_gpu_state(handle, run.path, run.schema_version,
                                             run.intervals.shape[0], run.world_size)
    run.problems.extend(problems)
    # The by-phase figures split the per-step samples; where those were left out, that
    # problem names the run already and the by-phase datasets are not read.
    if run.gpu_state is not None:
        run.gpu_state.phases, problems = read_gpu_phase_state(
            handle, run.path, run.schema_version, run.intervals.shape[0], run.world_size)
        run.problems.extend(problems)
    _read_collectives(handle, run)
    if "/memory/bytes" in handle:
        run.memory_bytes = _dataset(handle, "/memory/bytes", np.int64)
        run.peak_bytes = _dataset(handle, "/memory/peak_bytes", np.int64)
        run.peak_bytes_source = str(_text(handle["/memory/peak_bytes"].attrs.get("peak_source", "")))
    if "/summary" in handle:
        run.stored_summary = _attributes(handle["/summary"])
    if run.schema_version >= 2 and KERNEL_TRACE_GROUP in handle:
        run.kernel_trace_found = True
        run.kernel_trace, problems = read_kernel_trace(handle, run.path, run.world_size,
                                                       run.step_index, run.traced)
        run.problems.extend(problems)


def _steps_recorded(handle):
    try:
        return f"{handle['/steps/intervals'].shape[0]} steps recorded"
    except (KeyError, OSError, IndexError):
        return "no steps readable"


def _status_problem(run, handle):
    """Failed and unfinished runs are named and left out, whatever else they hold."""
    recorded = _steps_recorded(handle)
    if run.status == "failed":
        reason = run.attrs.get("failure_reason", "") or "no reason given"
        return Problem(run.path, "failed", f"{reason} ({recorded})", True)
    if run.status != STATUS_COMPLETE or run.path.endswith(".partial"):
        return Problem(run.path, "incomplete", f"status {run.status!r}, {recorded}; the "
                       "run did not finish", True)
    return None


def _does_not_read_back(run, error):
    message = str(error).strip("'\"")
    run.read_error = message.splitlines()[0] if message else type(error).__name__
    run.problems.append(Problem(run.path, "unreadable", f"does not read back ({run.read_error}); "
                                "counted as failed", True))
    print(f"warning: {run.path} does not read back ({run.read_error}); counted as failed",
          file=sys.stderr)


def read_run(path, also=None):
    """Reads one file. Never raises for bad content: problems land in run.problems and
    run.usable says whether the run may enter any number. also(handle, run), where
    given, reads more of the open file once the run's body is read, so that a caller
    that needs more than the run keeps (the trace's kernel records) opens it once."""
    run = RunRecord(path=str(path))
    try:
        with _open(path) as handle:
            run.attrs = _attributes(handle)
            for required in ("schema_version", "status", "world_size", "git_sha"):
                if required not in run.attrs:
                    raise MissingField(f"missing root attribute {required}")
            if run.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
                run.problems.append(Problem(run.path, "schema", "schema_version "
                                            f"{run.attrs['schema_version']}, this analysis "
                                            "reads " + ", ".join(
                                                map(str, SUPPORTED_SCHEMA_VERSIONS)), True))
                return run
            status_problem = _status_problem(run, handle)
            if status_problem is not None:
                run.problems.append(status_problem)
                return run
            _read_body(handle, run)
            if also is not None:
                also(handle, run)
    except MissingField as error:
        run.problems.append(Problem(run.path, "missing field", str(error), True))
        return run
    except READ_ERRORS as error:
        _does_not_read_back(run, error)
        return run

    n_steps = run.intervals.shape[0]
    collectives = run.collectives
    run.quantities = step_quantities(run.intervals, collectives["row"], collectives["rank"],
                                     collectives["begin"], collectives["end"],
                                     collectives["kind"], collectives["phase"],
                                     collectives["wait_begin"], collectives["wait_end"])
    measured_times = run.measured_step_times()
    if measured_times.size == 0:
        run.problems.append(Problem(run.path, "no measured steps", f"all {n_steps} steps "
                                    "are warm-up or traced", True))
        return run
    if np.isnan(measured_times).any():
        run.problems.append(Problem(run.path, "missing field", "the step phase is NaN in "
                                    f"{int(np.isnan(measured_times).sum())} measured steps",
                                    True))
        return run
    run.summary = compute_summary(run)
    if run.stored_summary:
        mismatched = compare_summary(run.stored_summary, run.summary)
        if mismatched:
            # The writer computed /summary from the same /steps, so a disagreement past the
            # tolerance means the file was altered or written by a faulty build: its steps
            # cannot be trusted either, and the run is left out.
            run.problems.append(Problem(run.path, "summary mismatch", "stored /summary "
                                        "disagrees with the recomputation for " +
                                        ", ".join(mismatched) + "; the run is left out",
                                        True))
            return run
    else:
        run.problems.append(Problem(run.path, "missing field", "no /summary in a complete "
                                    "file; recomputed from /steps", False))
    run.usable = True
    return run


def _is_benchmark_file(path):
    """Benchmark files (root attribute `bench`) share the suffix but are not runs; the
    bench report reads them. A file that cannot be opened is not one: it stays, to be
    reported."""
    try:
        with h5py.File(path, "r") as handle:
            return "bench" in handle.attrs
    except READ_ERRORS:
        return False


_WARNED = set()


def _warn_once(message):
    """One line on stderr, once per process: the report and predict look for files twice
    (to refuse an empty folder, then to read them)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"{Path(sys.argv[0]).name}: warning: {message}", file=sys.stderr)


def _skip_unlistable_folder(error):
    _warn_once(f"{error.filename}: skipped, the folder cannot be listed ({error.strerror})")


def _symlink_loop(path):
    """The OS's words for a name that leads round a loop of symlinks, else None. Such a
    name holds no file and cannot be shown relative to the folder (resolving it fails)."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return error.strerror
    return None


def find_result_files(results_dir):
    """The result files under results_dir, recursively, without benchmark files. A name
    that is a symlink loop, and a folder that cannot be listed, are skipped with a warning
    on stderr naming them; any other file that does not read stays, to be reported."""
    found = []
    for root, _, names in os.walk(results_dir, onerror=_skip_unlistable_folder):
        for name in names:
            path = Path(root) / name
            if not name.endswith(RESULT_SUFFIXES):
                continue
            loop = _symlink_loop(path)
            if loop is not None:
                _warn_once(f"{path}: skipped, a symlink loop ({loop})")
            elif not _is_benchmark_file(path):
                found.append(path)
    return sorted(found)


def shown_path(run, results_dir=None):
    """The run's path relative to results_dir where it lies inside, else as read."""
    if results_dir is not None:
        try:
            return str(Path(run.path).relative_to(results_dir))
        except ValueError:
            pass
    return run.path


def run_row(run, results_dir=None):
    """One flat row per run: provenance, config keys, recomputed summary, step times."""
    row = {"path": shown_path(run, results_dir), "status": run.status, "included": run.usable,
           "problem": "; ".join(p.message for p in run.problems if p.excluded)}
    for key in ("git_sha", "world_size", "nodes", "ranks_per_node", "backend", "start_time",
                "end_time", "scalestudy_version"):
        row[key] = run.attrs.get(key)
    row["link_emulation"] = machine.link_emulation(run)
    row["nccl_transports"] = machine.transports(run)
    row["link"] = machine.link_kind(run) or "—"
    row["comm_scope"] = machine.comm_scope(run) or "—"
    for key, value in sorted(run.config.items()):
        row[key if key not in row else f"config.{key}"] = value
    row["hosts"] = " ".join(sorted(set(map(str, run.hostnames))))
    row["repeat"] = run.config.get("repeat")
    for key in ("steps_measured",) + SUMMARY_FLOAT_KEYS + ("peak_source",):
        row[key] = run.summary.get(key, np.nan if key != "peak_source" else "")
    row["steps_traced"] = int(run.traced.sum()) if run.traced is not None else 0
    row["tracing_overhead"] = (run.kernel_trace.attribute("tracing_overhead")
                               if run.kernel_trace is not None else np.nan)
    row["step_times_s"] = run.measured_step_times() if run.usable else np.zeros(0)
    return row


def runs_frame(runs, results_dir=None):
    """A DataFrame of one run_row per run (paths relative to results_dir where given), its
    world_size numeric; empty without runs."""
    rows = [run_row(run, results_dir) for run in runs]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["world_size"] = pd.to_numeric(frame["world_size"], errors="coerce")
    return frame


def load_results(results_dir):
    """Reads every result file under results_dir. Returns (runs, frame, problems)."""
    runs = [read_run(path) for path in find_result_files(results_dir)]
    problems = [problem for run in runs for problem in run.problems]
    return runs, runs_frame(runs, results_dir), problems
