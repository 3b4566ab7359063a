"""Markdown pieces shared by the report's sections: number formats, tables, figures."""
import math
from pathlib import Path

import numpy as np


def fmt(value, digits=4):
    """A number as report text: integers as they are, others to `digits` significant digits;
    "—" for None, NaN or infinity."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}g}"


def percent(value):
    """A fraction as a percentage with one decimal ("12.3 %"); "—" for None or non-finite."""
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.1f} %"


def table(header, rows):
    """A Markdown table from a header and rows of cells that are already text."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def figure_markdown(figure):
    """A Figure as Markdown: its image and note, or one line saying why it was skipped."""
    if figure.file is None:
        return f"*{figure.title}: skipped ({figure.note}).*"
    note = f"\n\n*{figure.note}*" if figure.note else ""
    return f"![{figure.title}]({figure.file}){note}"


def relative(path, base):
    """`path` relative to `base` when it lies under it, else `path` unchanged, as text."""
    try:
        return str(Path(path).resolve().relative_to(Path(base).resolve()))
    except ValueError:
        return str(path)
