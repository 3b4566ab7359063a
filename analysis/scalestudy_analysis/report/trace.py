"""`scalestudy-report trace RUN.h5 [-o FILE.json]`: a run's timeline as Chrome Trace Event
JSON, the format that Perfetto (ui.perfetto.dev) and chrome://tracing open, and that
PyTorch's profiler and Nsight Systems export.

One process per rank. Its tracks: the steps; the compute stream's phases (data, forward,
backward, optimizer); each comm-stream phase (grad-comm, param-gather) on a track of its
own, since their spans may overlap; every collective; and, for a run made with
--profile-kernels, the kernel records of each GPU stream. Every event is complete ("X"),
with microseconds as the format wants them.

Steps are laid end to end on each rank: the file gives a phase's times from the start of
its step (docs/results-schema.md, /steps), so step i starts where step i-1 ended, and the
few milliseconds between two steps (rank 0 gathering the records) are not shown. Kernel
records carry CUPTI's clock, not the step's: each traced step's records are placed so that
its first record starts with the step. A trace the reader finds malformed is left out, and
the document's otherData lists the run's problems, that one among them."""
import json
import math
from pathlib import Path

import numpy as np

from scalestudy_analysis.results.load import read_run
from scalestudy_analysis.results.kernel_trace import kernel_records
from scalestudy_analysis.results.schema import COLLECTIVE_NAMES, PHASE_NAMES
from scalestudy_analysis.report.timeline import timeline_run

STEP_PHASE = "step"
COMM_PHASES = ("grad-comm", "param-gather")
TRACKS = {"steps": 0, "compute": 1, "grad-comm": 2, "param-gather": 3, "collectives": 4}
KERNEL_TRACK_BASE = 10  # kernel streams follow the fixed tracks


class TraceError(Exception):
    """The file cannot be drawn as a trace; the message says why."""


def step_starts(intervals, step_column):
    """[S, R] start of each step on each rank, in seconds from the first step's start."""
    lengths = np.nan_to_num(intervals[:, :, step_column, 1] - intervals[:, :, step_column, 0])
    return np.vstack([np.zeros((1, lengths.shape[1])), np.cumsum(lengths, axis=0)[:-1]])


def _event(name, track, rank, begin_s, end_s, category, args=None):
    event = {"name": name, "ph": "X", "pid": rank, "tid": track, "ts": begin_s * 1e6,
             "dur": max(end_s - begin_s, 0.0) * 1e6, "cat": category}
    if args:
        event["args"] = args
    return event


def _metadata(rank, label, tracks):
    events = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": label}},
              {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}]
    for name, track in tracks.items():
        events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": track, "args": {"name": name}},
                   {"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": track,
                    "args": {"sort_index": track}}]
    return events


def phase_events(run, phase_names, starts):
    """The steps and every recorded phase of every step and rank."""
    events = []
    step_column = phase_names.index(STEP_PHASE)
    steps, ranks = run.intervals.shape[:2]
    for row in range(steps):
        label = f"step {int(run.step_index[row])}" + (" (warm-up)" if run.warmup[row] else "")
        for rank in range(ranks):
            origin = starts[row, rank]
            for column, phase in enumerate(phase_names):
                begin, end = run.intervals[row, rank, column]
                if not (math.isfinite(begin) and math.isfinite(end)):
                    continue  # the phase did not happen in this step
                track = TRACKS["steps"] if column == step_column else TRACKS.get(phase, TRACKS["compute"])
                name = label if column == step_column else phase
                events.append(_event(name, track, rank, origin + begin, origin + end, "phase",
                                     {"step": int(run.step_index[row])}))
    return events


def collective_events(run, collective_names, starts):
    """Trace events (µs) of every recorded collective on its rank's collectives track; starts:
    [row, rank] step starts in seconds as step_starts gives them."""
    events = []
    columns = run.collectives
    for i in range(len(columns.get("step", ()))):
        row, rank = int(columns["row"][i]), int(columns["rank"][i])
        origin = starts[row, rank]
        kind = collective_names[int(columns["kind"][i])]
        events.append(_event(kind, TRACKS["collectives"], rank, origin + columns["begin"][i],
                             origin + columns["end"][i], "collective",
                             {"step": int(columns["step"][i]),
                              "payload_bytes": int(columns["payload_bytes"][i])}))
    return events


def kernel_events(records, run, starts):
    """The kernel records of every rank, each traced step's aligned to the step's start;
    and each rank's kernel tracks by name."""
    row_of = {int(step): row for row, step in enumerate(run.step_index)}
    events, tracks = [], {}
    for rank, (names, streams, columns) in sorted(records.items()):
        tracks[rank] = {f"GPU {stream}": KERNEL_TRACK_BASE + i for i, stream in enumerate(streams)}
        step, name, stream = columns["step"], columns["name"], columns["stream"]
        start_ns, end_ns = columns["start_ns"], columns["end_ns"]
        for traced_step in np.unique(step):
            if int(traced_step) not in row_of:
                continue
            mine = np.flatnonzero(step == traced_step)
            first_ns = start_ns[mine].min()
            origin = starts[row_of[int(traced_step)], rank]
            for i in mine:
                events.append(_event(names[name[i]], KERNEL_TRACK_BASE + int(stream[i]), rank,
                                     origin + (start_ns[i] - first_ns) / 1e9,
                                     origin + (end_ns[i] - first_ns) / 1e9, "kernel",
                                     {"step": int(traced_step)}))
    return events, tracks


def trace_document(path):
    """The Chrome Trace Event document of one run file, read once. The phase and
    collective names are the schema's, which read_run checks the file against."""
    records = {}

    def read_checked_records(handle, run):
        # The records are drawn only where read_run found the trace well formed: its
        # indices into the name and stream tables are then known to be in range.
        if run.kernel_trace is not None:
            records.update(kernel_records(handle))

    run = read_run(str(path), also=read_checked_records)
    if run.intervals is None:
        reasons = "; ".join(problem.message for problem in run.problems) or "no /steps"
        raise TraceError(f"{path}: no step intervals to draw ({reasons})")
    starts = step_starts(run.intervals, PHASE_NAMES.index(STEP_PHASE))
    kernels, kernel_tracks = kernel_events(records, run, starts)
    events = []
    for rank in range(run.world_size):
        host = run.hostnames[rank] if rank < len(run.hostnames) else "?"
        device = run.devices[rank] if rank < len(run.devices) else "?"
        events += _metadata(rank, f"rank {rank} ({host}, {device})", {**TRACKS, **kernel_tracks.get(rank, {})})
    events += phase_events(run, PHASE_NAMES, starts)
    events += collective_events(run, COLLECTIVE_NAMES, starts)
    events += kernels
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"file": str(path), "status": run.status, "git_sha": run.git_sha,
                          "world_size": run.world_size, "clock": "steps laid end to end per rank",
                          "problems": [problem.message for problem in run.problems]}}


def series_trace(series, out_dir):
    """The trace of the run whose step the report draws for a series (timeline_run), as
    out_dir/trace_<slug>.json; returns the file's name."""
    return write_trace(timeline_run(series).path, Path(out_dir) / f"trace_{series.slug}.json").name


def write_trace(path, out_path=None):
    """Writes the trace of `path` (default: beside it, .trace.json) and returns its path."""
    out_path = Path(out_path) if out_path else Path(str(path).removesuffix(".partial")).with_suffix(".trace.json")
    document = trace_document(path)
    partial = out_path.with_name(out_path.name + ".partial")
    partial.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
    partial.replace(out_path)
    return out_path
