"""The report's first screen: for each study (model and scaling mode), each series at its
largest N with its throughput and its efficiency against the common baseline, the fastest
series by throughput at every N, what each loses against the ideal and to what, and the
efficiency figure against that baseline."""
from scalestudy_analysis.render.markdown import figure_markdown, table
from scalestudy_analysis.report.scaling_loss import main_loss_sentence

# Two throughputs within this fraction of each other are a tie: the spread between runs
# of one point on a GPU is 0.2-0.5 % of the step, so a smaller lead says nothing.
TIE_FRACTION = 0.01


def studies(series_list):
    """{(model, scaling): [series]}, in the series' order."""
    grouped = {}
    for series in series_list:
        grouped.setdefault((series.fields.get("model", "?"), series.scaling), []).append(series)
    return grouped


def _at(series, n, column):
    return float(series.table.set_index("N").loc[n, column])


def fastest_line(members):
    """The series with the highest throughput at each N that two or more measured."""
    sizes = sorted({int(n) for series in members for n in series.table["N"]})
    parts = []
    for n in sizes:
        there = [s for s in members if n in set(s.table["N"])]
        if len(there) < 2:
            continue
        ranked = sorted(there, key=lambda s: _at(s, n, "tokens_per_s"), reverse=True)
        best = _at(ranked[0], n, "tokens_per_s")
        tied = [s for s in ranked if _at(s, n, "tokens_per_s") >= best * (1 - TIE_FRACTION)]
        if len(tied) > 1:
            parts.append(f"N = {n}: " + " and ".join(s.strategy_label for s in tied)
                         + f" tie (within {TIE_FRACTION:.0%})")
        else:
            runner_up = _at(ranked[1], n, "tokens_per_s")
            parts.append(f"N = {n}: {ranked[0].strategy_label} (+{100 * (best / runner_up - 1):.1f} %)")
    return ("Fastest by throughput: " + "; ".join(parts) + ".") if parts else None


def _efficiency_cell(series, n):
    value = _at(series, n, "efficiency_common")
    if value != value:  # NaN: no common baseline
        return "—"
    return (f"{value:.3f} [{_at(series, n, 'efficiency_common_q1'):.3f}–"
            f"{_at(series, n, 'efficiency_common_q3'):.3f}]")


def study_table(members):
    """The Markdown table of a study's series: largest N, tokens/s there, efficiency against
    the common baseline with its IQR, and against the series' own N0."""
    header = ["series", "largest N", "tokens/s", "efficiency vs common baseline [IQR]", "own efficiency"]
    rows = []
    for series in members:
        n = int(series.table["N"].max())
        rows.append([f"{series.index}: {series.strategy_label}", str(n), f"{_at(series, n, 'tokens_per_s'):,.0f}",
                     _efficiency_cell(series, n), f"{_at(series, n, 'efficiency'):.3f}"])
    return table(header, rows)


def baseline_line(members, baselines, named):
    """One sentence naming the common baseline of the members (baselines: {series index:
    baseline series}) and how it was chosen; named: --baseline chose it."""
    bases = sorted({(b.index, b.strategy_label, b.baseline_n) for s in members
                    if (b := baselines.get(s.index)) is not None})
    if not bases:
        return "No common baseline: each series' efficiency is against its own smallest N."
    how = "as --baseline names it" if named else "the fastest at the smallest N measured"
    return ("Common baseline: " + "; ".join(f"series {i} ({label}) at N0 = {n}" for i, label, n in bases)
            + f", {how}.")


def summary_section(series_list, baselines, named, headline_figures):
    """The markdown of the summary; headline_figures: {scaling: Figure}."""
    if not series_list:
        return "No usable runs: every file was left out (see Problems)."
    parts = []
    for (model, scaling), members in studies(series_list).items():
        parts += [f"### {model}, {scaling} scaling", ""]
        # The figure first: the HTML sets it beside the table that follows (html.STYLE).
        figure = headline_figures.get(scaling)
        if figure is not None:
            parts += [figure_markdown(figure), ""]
        parts += [study_table(members), "", baseline_line(members, baselines, named)]
        fastest = fastest_line(members)
        if fastest:
            parts.append(fastest)
        losses = [main_loss_sentence(s, int(s.table["N"].max())) for s in members]
        if any(losses):
            parts += ["", " ".join(sentence for sentence in losses if sentence)]
        parts.append("")
    return "\n".join(parts).rstrip()
