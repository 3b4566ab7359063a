"""The report's list of series with what each ran on and what built it, and the names of
whatever differs between them: a reader comparing two series sees first whether they
differ in more than the strategy."""
from . import machine
from .markdown import table

# Columns of the list: (heading, value of a series), in display order.
OVERVIEW_COLUMNS = (
    ("device", lambda s: _distinct(s, machine.device_model)),
    ("nodes×ranks per node (by N)", lambda s: _topologies(s)),
    ("backend", lambda s: _distinct(s, lambda r: str(r.attrs.get("backend", machine.UNKNOWN)))),
    ("precision", lambda s: str(s.fields.get("precision", machine.UNKNOWN))),
    ("build", lambda s: _distinct(s, machine.build)),
    ("CPU model", lambda s: _distinct(s, machine.cpu_model)),
    ("logical cores", lambda s: _distinct(s, machine.logical_cores)),
)
# Shown only where some series runs on the CPU backend: there they are the device.
CPU_COLUMNS = ("CPU model", "logical cores")


def _distinct(series, value_of):
    return " + ".join(sorted({str(value_of(run)) for run in series.runs}))


def _topologies(series):
    by_n = {}
    for run in sorted(series.runs, key=lambda r: r.world_size):
        by_n.setdefault(run.world_size, set()).add(machine.topology(run))
    return ", ".join(f"{n}: {' / '.join(sorted(shapes))}" for n, shapes in by_n.items())


def differing_columns(series_list):
    """Headings of the columns whose value is not the same for every series (the
    topology compared by its ranks per node, since N changes the node count)."""
    differing = []
    for heading, value_of in OVERVIEW_COLUMNS:
        if heading.startswith("nodes"):
            values = {run_packing for s in series_list
                      for run_packing in {machine.packing(run) or "1 node" for run in s.runs}}
            if len(values - {"1 node"}) > 1:
                differing.append(heading)
            continue
        if len({value_of(s) for s in series_list}) > 1:
            differing.append(heading)
    return differing


def overview_section(series_list):
    if not series_list:
        return "No series."
    with_cpu = any(str(run.attrs.get("backend")) == "cpu" for s in series_list for run in s.runs)
    columns = [(h, f) for h, f in OVERVIEW_COLUMNS if with_cpu or h not in CPU_COLUMNS]
    differing = [h for h in differing_columns(series_list) if with_cpu or h not in CPU_COLUMNS]
    rows = [[str(s.index), f"{s.strategy_label} {s.scaling}"] + [f(s) for _, f in columns]
            for s in series_list]
    lines = ["Runs that differ in device, topology (ranks per node), backend, precision, "
             "build (commit and dirty flag) or, on the CPU backend, CPU model and logical "
             "cores are never pooled: each such difference makes a series of its own.", ""]
    if differing:
        lines.append("**Differs between series:** " + ", ".join(differing) + ".")
    else:
        lines.append("Every series ran on the same kind of machine, from the same build.")
    lines += ["", table(["#", "series"] + [h for h, _ in columns], rows)]
    return "\n".join(lines)
