"""The grid of a `bench inference` file as the seed's tables are read: latency and
sequences/s against batch, one panel per sequence length, and beside scalestudy's curves
PyTorch's eager and torch.compile ones from the JSON that peers/inference_vs_pytorch.py
writes (`scalestudy-bench-report --pytorch FILE.json`).

PyTorch's points are drawn beside a file only when they are of the same model (preset name
and shape) and ran on the same GPU: figures from two machines compare the machines.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scalestudy_analysis.render.markdown import table

PYTORCH_KIND = "scalestudy inference vs pytorch"
PYTORCH_VERSIONS = (1,)
MODES = ("eager", "compile")
SHAPE_KEYS = ("layers", "hidden", "heads", "vocab", "attention")
STYLE = {"scalestudy": ("o", "-"), "eager": ("s", "--"), "compile": ("^", ":")}


@dataclass
class PytorchRuns:
    """PyTorch's inference points as peers/inference_vs_pytorch.py --json writes them: its
    machine and settings, and per model its shape and a DataFrame of points (batch, seq, mode,
    status, latency_ms, sequences_per_s)."""
    path: str
    machine: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)  # model -> (shape dict, DataFrame of points)


def read_pytorch(path):
    """Reads the script's JSON; raises ValueError, in one line, for any other file."""
    try:
        loaded = json.loads(Path(path).read_text())
        known = (loaded.get("kind"), loaded.get("version")) in [(PYTORCH_KIND, v) for v in PYTORCH_VERSIONS]
    except (OSError, ValueError, AttributeError) as error:  # unreadable, not JSON, not a JSON object
        raise ValueError(f"--pytorch {path}: {error}") from None
    if not known:
        raise ValueError(f"--pytorch {path}: not a file of peers/inference_vs_pytorch.py --json")
    runs = PytorchRuns(str(path), loaded.get("machine", {}), loaded.get("settings", {}))
    for model, entry in loaded.get("models", {}).items():
        points = pd.DataFrame(entry.get("pytorch", []), columns=["batch", "seq", "mode", "status", "detail",
                                                                 "latency_ms", "sequences_per_s"])
        runs.models[model] = (entry.get("shape", {}), points)
    return runs


def pytorch_for(bench, runs):
    """(PyTorch's points for this inference file, or None; a note saying why not)."""
    model = str(bench.method.get("model", ""))
    if model not in runs.models:
        return None, f"{runs.path} has no model {model!r}: {bench.path} is drawn alone"
    shape, points = runs.models[model]
    differing = [key for key in SHAPE_KEYS if str(shape.get(key)) != str(bench.method.get(key))]
    if differing:
        return None, (f"{runs.path}'s {model} differs from {bench.path}'s in {', '.join(differing)}: "
                      "not the same model, drawn alone")
    gpu = str(runs.machine.get("gpu", ""))
    if not gpu or not bench.device.startswith(gpu):
        return None, (f"PyTorch ran on {gpu or 'an unnamed GPU'!r}, {bench.path} on {bench.device!r}: not side "
                      "by side, drawn alone")
    return points, ""


def speedups(bench_points, pytorch_points, mode):
    """Per (batch, seq) of the file: PyTorch's latency over scalestudy's (above 1: scalestudy
    is faster), or the status of the side that did not run."""
    theirs = pytorch_points[pytorch_points["mode"] == mode].set_index(["batch", "seq"])
    rows = []
    for point in bench_points.to_dict("records"):
        key = (point["batch"], point["seq"])
        other = theirs.loc[key] if key in theirs.index else None
        if point["status"] != "ok":
            cell = point["status"].upper() if point["status"] == "oom" else point["status"]
        elif other is None:
            cell = "—"
        elif other["status"] != "ok":
            cell = f"PyTorch {other['status']}"
        else:
            cell = f"{other['latency_ms'] / point['latency_ms']:.3f}"
        rows.append({"batch": point["batch"], "seq": point["seq"], "cell": cell})
    frame = pd.DataFrame(rows, columns=["batch", "seq", "cell"])
    return frame.pivot_table(index="batch", columns="seq", values="cell", aggfunc="first").fillna("")


def _curves(bench, pytorch_points):
    """(label, side, DataFrame of ok points with batch, seq, latency_ms, sequences_per_s)."""
    ours = bench.points
    curves = [(f"scalestudy {bench.attrs.get('precision', '')}".strip(), "scalestudy", ours[ours["status"] == "ok"])]
    if pytorch_points is not None:
        for mode in MODES:
            mine = pytorch_points[(pytorch_points["mode"] == mode) & (pytorch_points["status"] == "ok")]
            if not mine.empty:
                curves.append((f"PyTorch {mode} fp16", mode, mine))
    return curves


def _not_run(bench, pytorch_points, seq):
    """One line per side: the batches at this length that it did not run."""
    sides = [("scalestudy", bench.points)]
    if pytorch_points is not None:
        sides += [(mode, pytorch_points[pytorch_points["mode"] == mode]) for mode in MODES]
    lines = []
    for side, points in sides:
        failed = points[(points["seq"] == seq) & (points["status"] != "ok")]
        if not failed.empty:
            lines.append(f"{side} {'/'.join(sorted(set(failed['status'])))}: b "
                         + ",".join(str(int(b)) for b in sorted(failed["batch"])))
    return lines


def plot_inference_grid(bench, pytorch_points, path):
    """Writes the PNG at `path`: latency (ms) and sequences/s against batch, one column per
    sequence length; PyTorch's eager and compile points beside scalestudy's when
    `pytorch_points` is not None, and the batches a side did not run noted in each panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    seqs = sorted(int(s) for s in bench.points["seq"].unique())
    batches = sorted(int(b) for b in bench.points["batch"].unique())
    figure, axes = plt.subplots(2, len(seqs), figsize=(3.3 * len(seqs) + 1.5, 6.4), squeeze=False, sharex=True)
    curves = _curves(bench, pytorch_points)
    for column, seq in enumerate(seqs):
        for row, (value, label) in enumerate((("latency_ms", "latency (ms)"), ("sequences_per_s", "sequences/s"))):
            axis = axes[row][column]
            for name, side, points in curves:
                mine = points[points["seq"] == seq].sort_values("batch")
                marker, line = STYLE[side]
                axis.plot(mine["batch"], mine[value], marker=marker, linestyle=line, markersize=4, label=name)
            axis.set_xscale("log", base=2)
            axis.set_xticks(batches, [str(b) for b in batches], fontsize=7)
            axis.set_yscale("log")
            axis.grid(True, which="both", alpha=0.3)
            if column == 0:
                axis.set_ylabel(label)
            if row == 0:
                axis.set_title(f"seq {seq}")
                notes = _not_run(bench, pytorch_points, seq)
                if notes:
                    axis.text(0.02, 0.98, "\n".join(notes), transform=axis.transAxes, fontsize=6, va="top")
            else:
                axis.set_xlabel("batch")
    legend = {}
    for axis in axes[0]:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="upper right", fontsize=7)
    figure.suptitle(f"{bench.method.get('model', 'inference')} on {bench.device}", fontsize=9, x=0.02, ha="left")
    figure.tight_layout(rect=(0, 0, 0.9, 0.95))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def inference_section(bench, runs, out_dir, figure_file):
    """Markdown lines: the figure, and with PyTorch's points the speedups against each mode."""
    pytorch_points, note = pytorch_for(bench, runs) if runs is not None else (None, "")
    plot_inference_grid(bench, pytorch_points, out_dir / figure_file)
    lines = ["", f"![inference grid]({figure_file})"]
    if note:
        lines += ["", f"*{note}.*"]
    if pytorch_points is None:
        return lines
    settings = runs.settings
    lines += ["", f"PyTorch from `{runs.path}`: torch {runs.machine.get('torch', '?')}, fp16, "
                  f"torch.compile of scope {settings.get('compile_scope', '?')}, same GPU."]
    for mode in MODES:
        frame = speedups(bench.points, pytorch_points, mode)
        lines += ["", f"**Speedup against PyTorch {mode}** (PyTorch ms / scalestudy ms, above 1: scalestudy is "
                      "faster), by batch × seq", "",
                  table(["batch"] + [str(c) for c in frame.columns],
                        [[str(index)] + [str(v) for v in row] for index, row in frame.iterrows()])]
    return lines
