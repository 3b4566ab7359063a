"""Markdown pieces shared by the report's sections: number formats, tables, figures."""
import math
from pathlib import Path

import numpy as np


def fmt(value, digits=4):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}g}"


def percent(value):
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.1f} %"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def figure_markdown(figure):
    if figure.file is None:
        return f"*{figure.title}: skipped ({figure.note}).*"
    note = f"\n\n*{figure.note}*" if figure.note else ""
    return f"![{figure.title}]({figure.file}){note}"


def relative(path, base):
    try:
        return str(Path(path).resolve().relative_to(Path(base).resolve()))
    except ValueError:
        return str(path)
