"""What every figure of the reports shares: the Figure entry a section lists, N on a log-2
axis with one tick per N (world_size_axis), the PNG written at one DPI and closed
(save_figure), a legend right of the axes (legend_outside), a title in lines of 70
characters (wrap_title), and which ranks a per-rank figure draws (ranks_to_show)."""
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

DPI = 120
MAX_RANKS_SHOWN = 16


@dataclass
class Figure:
    """A figure of the report: its PNG relative to the output directory (None when skipped),
    its title, and a note shown under it or saying why it was skipped."""
    file: str          # relative to the output directory; None when skipped
    title: str
    note: str = ""


def world_size_axis(axis, sizes, log=True):
    """N on the x axis: log 2 where several N are drawn, a tick at each."""
    sizes = sorted({int(n) for n in sizes})
    if log and len(sizes) > 1:
        axis.set_xscale("log", base=2)
    axis.set_xticks(sizes)
    axis.set_xticklabels([str(n) for n in sizes])
    axis.minorticks_off()
    axis.set_xlabel("world size N (ranks)")


def save_figure(figure, out_dir, name):
    """Writes out_dir/name at the report's DPI, closes the figure, returns name."""
    figure.tight_layout()
    figure.savefig(out_dir / name, dpi=DPI)
    plt.close(figure)
    return name


def legend_outside(axis):
    """A legend right of the axes, so it never covers a line however many there are."""
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                borderaxespad=0.0)


def wrap_title(text, width=70):
    """text in lines of at most width characters, broken between words."""
    words, lines, current = text.split(), [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    lines.append(current)
    return "\n".join(lines)


def ranks_to_show(world_size, critical_rank):
    """All ranks up to MAX_RANKS_SHOWN; beyond that an even spread that always includes
    the rank that set the step time."""
    if world_size <= MAX_RANKS_SHOWN:
        return list(range(world_size))
    chosen = set(np.linspace(0, world_size - 1, MAX_RANKS_SHOWN - 1).round().astype(int))
    chosen.add(int(critical_rank))
    return sorted(chosen)
