"""The bandwidth each collective achieved in training (/collectives: payload bytes over
the time the comm stream spent on it), against N, with nccl-tests' bus bandwidth, and
beside `scalestudy bench comm`'s bus bandwidth at the nearest size where a bench file of
the same world size is given (--bench)."""
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy_analysis.results import machine  # noqa: E402
from scalestudy_analysis.bench.report import bus_factor as _bench_bus_factor, read_bench_file  # noqa: E402
from scalestudy_analysis.render.markdown import fmt, table  # noqa: E402
from scalestudy_analysis.render.figures import Figure, legend_outside, save_figure, world_size_axis, wrap_title  # noqa: E402
from scalestudy_analysis.results.schema import COLLECTIVE_NAMES  # noqa: E402

LINES_SHOWN = 4   # the (collective, size) pairs that moved the most bytes get a line


def bus_factor(collective, world_size):
    """nccl-tests' factor from algorithm to bus bandwidth; broadcast's is 1."""
    return 1.0 if collective == "broadcast" else _bench_bus_factor(collective, world_size)


def _size_label(payload):
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if payload >= scale:
            return f"{payload / scale:.3g} {unit}"
    return f"{int(payload)} B"


def collective_records(run):
    """(kind name, payload bytes, seconds) of every collective of the measured steps that
    moved bytes and took time."""
    columns = run.collectives
    if not columns or len(columns["row"]) == 0:
        return pd.DataFrame(columns=["collective", "payload_bytes", "seconds"])
    measured = run.measured[columns["row"]]
    seconds = np.asarray(columns["end"], dtype=float) - np.asarray(columns["begin"], dtype=float)
    payload = np.asarray(columns["payload_bytes"], dtype=np.int64)
    kind = np.asarray(columns["kind"], dtype=np.int64)
    keep = measured & (payload > 0) & (seconds > 0) & (kind >= 0) & (kind < len(COLLECTIVE_NAMES))
    return pd.DataFrame({"collective": np.array(COLLECTIVE_NAMES)[kind[keep]],
                         "payload_bytes": payload[keep], "seconds": seconds[keep]})


def bandwidth_table(series, benches=()):
    """One row per N > 1, collective and payload size: records, median time, algorithm
    and bus bandwidth (GB/s), and the bench's bus bandwidth at the nearest size measured
    with the same world size (NaN without one)."""
    by_n = defaultdict(list)
    for run in series.runs:
        if run.world_size > 1:
            by_n[run.world_size].append(collective_records(run))
    rows = []
    for n in sorted(by_n):
        records = pd.concat(by_n[n], ignore_index=True)
        for (collective, payload), group in records.groupby(["collective", "payload_bytes"]):
            seconds = float(np.median(group["seconds"]))
            algbw = payload / seconds / 1e9
            bench_busbw, bench_bytes = nearest_bench(benches, collective, n, payload,
                                                     machine.link_emulation(series.runs[0]))
            rows.append({"N": n, "collective": collective, "payload_bytes": int(payload),
                         "records": len(group), "median_s": seconds, "algbw_gb_per_s": algbw,
                         "busbw_gb_per_s": algbw * bus_factor(collective, n),
                         "bench_busbw_gb_per_s": bench_busbw, "bench_bytes": bench_bytes})
    return pd.DataFrame(rows, columns=["N", "collective", "payload_bytes", "records", "median_s",
                                       "algbw_gb_per_s", "busbw_gb_per_s",
                                       "bench_busbw_gb_per_s", "bench_bytes"])


def load_benches(paths):
    """The usable comm bench files among paths, and the problems of the others."""
    benches, problems = [], []
    for path in paths or ():
        bench = read_bench_file(path)
        problems.extend(bench.problems)
        if bench.usable and bench.name == "comm":
            benches.append(bench)
    return benches, problems


def nearest_bench(benches, collective, world_size, payload, link_emulation="none"):
    """(bus bandwidth, size) of the bench point of this collective, world size and link
    emulation (a series' runs share theirs) whose size is nearest on a log scale; (NaN,
    NaN) without one."""
    best = (math.inf, math.nan, math.nan)
    for bench in benches:
        if int(bench.attrs.get("world_size", 0)) != world_size or machine.link_emulation(bench) != link_emulation:
            continue
        # Training's collectives span every rank: the world scope's points are their match.
        points = bench.points[(bench.points["collective"] == collective)
                              & (bench.points["scope"] == "world")
                              & (bench.points["status"] == "ok")]
        for size, busbw in zip(points["bytes"], points["busbw_gb_per_s"]):
            distance = abs(math.log(float(size) / payload))
            if distance < best[0]:
                best = (distance, float(busbw), float(size))
    return best[1], best[2]


def _lines(frame):
    moved = frame.assign(moved=frame["payload_bytes"] * frame["records"])
    totals = moved.groupby(["collective", "payload_bytes"])["moved"].sum()
    return list(totals.sort_values(ascending=False).index[:LINES_SHOWN])


def bandwidth_figure(series, frame, out_dir):
    """Figure: achieved bus bandwidth (GB/s) per collective and size against N, bench comm's
    dashed where given; writes bandwidth_<slug>.png, or is skipped for an empty frame."""
    title = f"Achieved bus bandwidth per collective: {series.label}"
    if frame.empty:
        return Figure(None, title, "no collective between two or more ranks was recorded")
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for collective, payload in _lines(frame):
        rows = frame[(frame["collective"] == collective) & (frame["payload_bytes"] == payload)]
        line, = axis.plot(rows["N"], rows["busbw_gb_per_s"], marker="o",
                          label=f"{collective} {_size_label(payload)}")
        bench = rows.dropna(subset=["bench_busbw_gb_per_s"])
        if not bench.empty:
            axis.plot(bench["N"], bench["bench_busbw_gb_per_s"], marker="s", linestyle="--",
                      markerfacecolor="none", color=line.get_color(),
                      label=f"bench comm, nearest to {_size_label(payload)}")
    world_size_axis(axis, frame["N"])
    axis.set_ylim(bottom=0)
    axis.set_ylabel("bus bandwidth (GB/s), median over records")
    axis.set_title(wrap_title(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    legend_outside(axis)
    return Figure(save_figure(figure, out_dir, f"bandwidth_{series.slug}.png"), title)


def bandwidth_markdown(frame):
    """The bandwidth section from bandwidth_table's frame: per N, collective and size the
    median time (ms), algbw and busbw (GB/s), and bench comm's busbw where given."""
    if frame.empty:
        return "*No collective between two or more ranks was recorded.*"
    with_bench = frame["bench_busbw_gb_per_s"].notna().any()
    header = ["N", "collective", "size", "records", "median time (ms)", "algbw (GB/s)",
              "busbw (GB/s)"] + (["bench busbw (GB/s) at size"] if with_bench else [])
    rows = []
    for _, row in frame.iterrows():
        cells = [str(int(row["N"])), row["collective"], _size_label(row["payload_bytes"]),
                 str(int(row["records"])), fmt(1e3 * row["median_s"]), fmt(row["algbw_gb_per_s"]),
                 fmt(row["busbw_gb_per_s"])]
        if with_bench:
            cells.append("—" if math.isnan(row["bench_busbw_gb_per_s"]) else
                         f"{fmt(row['bench_busbw_gb_per_s'])} at {_size_label(row['bench_bytes'])}")
        rows.append(cells)
    return ("Per collective and size, over every rank's records of the measured steps: payload "
            "bytes over the comm stream's time on it (algbw), times nccl-tests' bus factor "
            "(busbw). In training a collective also waits for the slowest rank to join, so "
            "busbw here is at most what `bench comm` measures.\n\n" + table(header, rows))
