"""scalestudy-report trace: a run file as Chrome Trace Event JSON. The document follows
the format (complete events with name, ph, pid, tid, ts and dur in microseconds; metadata
naming processes and threads), and every interval of the file is in it: each phase of
each step and rank, each collective, and each kernel record of a traced run."""
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from scalestudy_analysis.report.cli import main
from scalestudy_analysis.report.trace import trace_document
from synth import base_config, trace_records, write_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"
# Times go through seconds -> microseconds as float64; a tenth of a nanosecond is far
# below any interval the files hold and far above the rounding of the conversion.
TIME_TOLERANCE_US = 1e-4


def trace_of(tmp_path, run):
    out = tmp_path / "trace.json"
    assert main(["trace", str(run), "-o", str(out)]) == 0
    return json.loads(out.read_text())


def check_format(document):
    """The Trace Event format's rules for the events this tool writes."""
    assert isinstance(document["traceEvents"], list) and document["displayTimeUnit"] in ("ms", "ns")
    named_threads = set()
    for event in document["traceEvents"]:
        assert event["ph"] in ("X", "M"), event
        assert isinstance(event["pid"], int) and isinstance(event["name"], str)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event["tid"], int)
        assert math.isfinite(event["ts"]) and event["ts"] >= 0
        assert math.isfinite(event["dur"]) and event["dur"] >= 0
    used = {(e["pid"], e["tid"]) for e in document["traceEvents"] if e["ph"] == "X"}
    assert used <= named_threads  # every track a viewer shows has a name


def events(document, category):
    return [e for e in document["traceEvents"] if e["ph"] == "X" and e.get("cat") == category]


def test_every_phase_and_collective_of_a_real_run_is_in_its_trace(tmp_path):
    run = EXAMPLE / "strong" / "zero2-overlap_on" / "n4-r0.h5"
    document = trace_of(tmp_path, run)
    check_format(document)
    with h5py.File(run, "r") as handle:
        intervals = handle["steps/intervals"][()]
        collectives = {name: handle[f"collectives/{name}"][()] for name in ("step", "rank", "begin", "end")}
        step_index = handle["steps/step_index"][()]
    lengths = intervals[:, :, 6, 1] - intervals[:, :, 6, 0]
    starts = np.vstack([np.zeros((1, lengths.shape[1])), np.cumsum(lengths, axis=0)[:-1]])
    phases = events(document, "phase")
    found = {(e["pid"], round(e["ts"], 3), round(e["dur"], 3)) for e in phases}
    expected = 0
    for row, rank, column in np.ndindex(intervals.shape[:3]):
        begin, end = intervals[row, rank, column]
        if np.isnan(begin):
            continue
        expected += 1
        ts, dur = (starts[row, rank] + begin) * 1e6, (end - begin) * 1e6
        assert (rank, round(ts, 3), round(dur, 3)) in found, (row, rank, column)
    assert len(phases) == expected
    row_of = {int(step): row for row, step in enumerate(step_index)}
    by_start = sorted((e["pid"], e["ts"], e["dur"]) for e in events(document, "collective"))
    wanted = sorted((int(rank), (starts[row_of[int(step)], rank] + begin) * 1e6, (end - begin) * 1e6)
                    for step, rank, begin, end in zip(*collectives.values()))
    assert len(by_start) == len(wanted) == len(collectives["step"])
    for got, want in zip(by_start, wanted):
        assert got[0] == want[0]
        assert got[1:] == pytest.approx(want[1:], abs=TIME_TOLERANCE_US)


def test_a_traced_runs_kernels_are_each_in_the_trace_within_their_step(tmp_path):
    kernels = [("sm90_xmma_gemm", "gemm", 4000), ("layernorm_forward", "norm_elementwise", 1000),
               ("ncclAllReduce", "communication", 3000)]
    ranks = [trace_records((3, 4), kernels)] * 2
    run = tmp_path / "traced.h5"
    write_run(run, world_size=2, steps=6, warmup_steps=1, step_times=0.01, backend="cuda",
              traced_steps=(3, 4), kernel_trace=ranks, config=base_config(global_batch=16))
    document = trace_of(tmp_path, run)
    check_format(document)
    kernel_events = events(document, "kernel")
    assert len(kernel_events) == sum(len(records) for records in ranks)
    steps = {e["pid"]: {} for e in kernel_events}
    for event in events(document, "phase"):
        if event["tid"] == 0:
            steps.setdefault(event["pid"], {})[event["args"]["step"]] = (event["ts"], event["ts"] + event["dur"])
    for event in kernel_events:
        begin, end = steps[event["pid"]][event["args"]["step"]]
        assert begin - TIME_TOLERANCE_US <= event["ts"] <= end + TIME_TOLERANCE_US
    durations = sorted(e["dur"] for e in kernel_events if e["pid"] == 0)
    assert durations == pytest.approx(sorted(d / 1e3 for _, _, _, d in ranks[0]))


def test_the_trace_reads_its_file_once(tmp_path, monkeypatch):
    ranks = [trace_records((3,), [("sm90_xmma_gemm", "gemm", 4000)])] * 2
    run = tmp_path / "traced.h5"
    write_run(run, world_size=2, steps=5, warmup_steps=1, step_times=0.01, backend="cuda",
              traced_steps=(3,), kernel_trace=ranks, config=base_config(global_batch=16))
    opened = []
    real_file = h5py.File
    monkeypatch.setattr(h5py, "File", lambda *args, **kwargs: opened.append(args[0]) or real_file(*args, **kwargs))
    document = trace_document(run)
    assert opened == [str(run)] and len(events(document, "kernel")) == len(ranks[0]) * 2


def test_a_file_that_is_not_there_exits_2(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "missing.h5")]) == 2
    assert "missing.h5" in capsys.readouterr().err


def test_a_malformed_kernel_trace_leaves_the_kernels_out_and_says_why(tmp_path):
    ranks = [trace_records((3,), [("sm90_xmma_gemm", "gemm", 4000)])] * 2
    run = tmp_path / "traced.h5"
    write_run(run, world_size=2, steps=5, warmup_steps=1, step_times=0.01, backend="cuda",
              traced_steps=(3,), kernel_trace=ranks, config=base_config(global_batch=16))
    with h5py.File(run, "r+") as handle:
        names = handle["kernel_trace/rank_1/name"][()]
        names[0] = 99       # rank 1's names table has one entry
        handle["kernel_trace/rank_1/name"][...] = names
    document = trace_of(tmp_path, run)
    check_format(document)
    assert events(document, "kernel") == [] and len(events(document, "phase")) > 0
    (problem,) = document["otherData"]["problems"]
    assert "/kernel_trace/rank_1/name holds 99" in problem
