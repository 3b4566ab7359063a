"""The outputs of scalestudy-predict: prediction.md and its HTML twin, predictions.csv and
.json, what-it-takes.csv (the plot is predict/plot.py's)."""
import json
import math
from pathlib import Path

from scalestudy_analysis.render.html import write_html
from scalestudy_analysis.predict.flags import FLAG_GPU, FLAG_MEMORY
from scalestudy_analysis.predict.plot import plot_predictions

TABLE_SIZES = (8, 64, 512, 4096)
TAKE_SIZES = (64, 512, 4096)
TAKE_TARGETS = (0.9, 0.8)
TAKE_RANGE_BYTES_PER_S = (1e8, 1e13)   # the bisection's bounds: 0.1 GB/s to 10 TB/s


ASSUMES = """\
- **Compute** of one micro-batch follows t_c(b) = k·b^p through the micro-batches
  measured; outside them the kernels' behaviour is not known: those points are flagged
  and their curves drawn dashed. It is the measured GPU's unless --compute-scale says
  how the network file's GPU compares.
- **Collectives** run one after another on the comm stream, each as the tuning model of
  the NCCL version the files record times it (its constants in predict/nccl_tuning.py): ring,
  tree (allreduce), PAT (allgather and reduce-scatter at one GPU per node, NCCL ≥ 2.23),
  NVLS only where the network file enables it; LL, LL128 (inside a node) and Simple;
  the fastest. The bandwidth across nodes is that of every NIC of a node together, at
  its line rate or as bench comm across nodes measured it.
- **Overlap** hides the share h of communication measured in the sweep, never more than
  the share w of compute that communication ran beside; the rest is exposed.
- **Stragglers** add σ·√(2 ln N), σ the jitter of one rank's compute measured across
  the ranks of a step.
- **Left out**: contention from other jobs and oversubscribed switches, topologies of
  more than two levels, CollNet/SHARP, NCCL's per-channel bandwidth caps and tree
  corrections by size, failures and restarts, and any kernel's behaviour at a
  micro-batch never measured."""


def _fmt(value, digits=3):
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _band(row, key, scale=1.0, digits=3):
    return (f"{_fmt(row[key] * scale, digits)} [{_fmt(row[key + '_lo'] * scale, digits)}–"
            f"{_fmt(row[key + '_hi'] * scale, digits)}]")


def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def _check_section(studies):
    rows = []
    for study in studies:
        check = study.check
        if check is None:
            rows.append([study.label, "—", "—", "—", "—",
                         "one N measured: nothing to hold out"])
            continue
        extrapolated = check["micro_batch"] < check["smallest_fitted_batch"] - 1e-9
        rows.append([study.label, ", ".join(map(str, check["fit_N"])), check["predicted_N"],
                     _fmt(1e3 * check["predicted_step_s"], 4),
                     _fmt(1e3 * check["measured_step_s"], 4),
                     f"{100 * check['signed_error']:+.2f} %"
                     + (" (micro-batch below those fitted)" if extrapolated else "")])
    return _md_table(["strategy", "fitted on N", "predicted N", "predicted step (ms)",
                      "measured step (ms)", "signed error"], rows)


def _ledger_section(ledger):
    if ledger.data is None:
        return "*Ledger not used (--no-ledger).*"
    entries = ledger.data["entries"]
    scored = [e for e in entries if e.get("score")]
    where = (f"Kept in `{ledger.path}`, keyed by workload, network and NCCL version: an "
             "entry is scored only by a run of the same workload on the same network (its "
             "ranks per node the network's packing of N) under the same NCCL.")
    open_count = len(entries) - len(scored)
    if not scored:
        return (f"{where}\n\n{open_count} predictions wait for their N to be measured; "
                "none scored yet.")
    rows = [[e["workload"]["strategy"], e["workload"]["scaling"], e["N"],
             ", ".join(map(str, e["fit_N"])), e["network"], e["nccl_version"], e["made_utc"],
             _fmt(1e3 * e["predicted_step_s"], 4), _fmt(1e3 * e["score"]["measured_step_s"], 4),
             f"{100 * e['score']['signed_error']:+.2f} %",
             "yes" if e["score"]["inside_interval"] else "no"] for e in scored]
    return (f"{where}\n\n{len(scored)} predictions scored, {open_count} still open.\n\n"
            + _md_table(["strategy", "scaling", "N", "fitted on N", "network", "NCCL", "made",
                         "predicted (ms)", "measured (ms)", "signed error", "inside interval"],
                        rows))


def _error_section(error, level):
    """The model's measured error: the residuals, s, the rule, the coverage."""
    if not error.known:
        return ("No N could be held out (one N measured, no scored ledger entry): the "
                "model's own error is unknown, and the intervals are the bootstrap's alone.")
    inside, judged = error.coverage()
    rows = [[r.strategy, r.source, r.size, ", ".join(map(str, r.fit_sizes)), f"{r.factor:g}",
             _fmt(1e3 * r.predicted_s, 4), _fmt(1e3 * r.measured_s, 4),
             f"{100 * r.signed_error:+.2f} %",
             "—" if covered is None else "yes" if covered else "no"]
            for r, covered in zip(error.residuals, error.covered)]
    widths = ", ".join(f"x = {x}: ×/÷ {math.exp(error.half_width(x)):.3f}"
                       for x in (1, 2, 16, 128, 1024))
    return (f"Nominal level {int(round(100 * level))} %. Measured coverage on held-out "
            f"points: **{inside} of {judged}** inside the band made from the other "
            f"residuals. {len(error.residuals)} residuals give s = "
            f"{100 * error.scale:.2f} % (root mean square of ln(predicted/measured)/g(x)), "
            f"t = {error.quantile:.3f} (Student, {len(error.residuals)} degrees of freedom). "
            "The model's share of an interval is exp(±t·s·g(x)), g(x) = 1 + log2 x, with x "
            "the factor by which N exceeds the largest N measured: an error of a term that "
            "grows with N is systematic and adds up with every doubling past the data. It "
            "combines with the bootstrap's width in quadrature; step time, tokens/s and "
            "efficiency carry it, exposed communication and memory the bootstrap alone. "
            f"Model share by x: {widths}.\n\n"
            + _md_table(["strategy", "held out by", "N", "fitted on N", "x", "predicted (ms)",
                         "measured (ms)", "signed error", "inside the others' band"], rows))


def _take_section(take, network):
    rows = []
    for label, by_target in take.items():
        for size in TAKE_SIZES:
            cells = [label, size, _fmt(by_target["described"][size], 3)]
            for target in TAKE_TARGETS:
                value = by_target[target][size]
                floor = value is not None and value <= TAKE_RANGE_BYTES_PER_S[0] * (1 + 1e-9)
                cells.append("not reachable" if value is None else
                             f"≤ {value / 1e9:.3g}" if floor else f"{value / 1e9:.3g}")
            rows.append(cells)
    return (f"Weak scaling at the weak-scaling micro-batch; bandwidth per GPU across nodes "
            f"(GB/s per direction), everything else as in `{network.name}`. \"Not reachable\": "
            "even 10 TB/s leaves the efficiency below the target, which latency, the node's own "
            "bus or the work that does not shrink then bound.\n\n"
            + _md_table(["strategy", "N", "efficiency on this network"]
                        + [f"needed for {int(100 * t)} %" for t in TAKE_TARGETS], rows))


def _prediction_rows(predictions, scaling):
    frame = predictions[(predictions["scaling"] == scaling)
                        & predictions["N"].isin((1, 2, 4) + TABLE_SIZES)]
    return [[r["strategy"], int(r["N"]), f"{r['micro_batch']:g}"
             + (" *" if r["beyond_measured_batch"] else ""), _band(r, "step_time_s", 1e3),
             _band(r, "tokens_per_s", 1e-3), _band(r, "efficiency"),
             _band(r, "exposed_comm_s", 1e3), f"{r['memory_per_gpu_bytes'] / 2 ** 30:.3g}"
             + (" **(exceeds)**" if r["exceeds_gpu_memory"] else ""),
             r["algorithms"], f"**{r['flags']}**" if r["flags"] else ""]
            for _, r in frame.iterrows()]


PREDICTION_HEADER = ["strategy", "N", "micro-batch", "step (ms)", "ktokens/s", "efficiency",
                     "exposed comm (ms)", "memory/GPU (GiB)", "NCCL algorithm/protocol",
                     "flags"]


def _flags_section(studies, network, args):
    """What the tables flag, and why."""
    memory = ("no GPU memory given" if network.gpu_memory_bytes == math.inf else
              f"{network.gpu_memory_bytes / 1e9:g} GB ({network.gpu_memory_bytes / 2 ** 30:.3g} "
              "GiB)")
    lines = [f"- **{FLAG_MEMORY}**: memory per GPU above the network file's GPU, {memory}: "
             "such a point does not run as predicted."]
    notes = sorted({s.gpu_note for s in studies if s.gpu_note})
    if notes and args.compute_scale is None:
        lines.append(f"- **{FLAG_GPU}**: {'; '.join(notes)}; every prediction carries the "
                     "measured GPU's compute (`--compute-scale F` gives the ratio and lifts "
                     "the flag).")
    elif notes:
        lines.append(f"- {'; '.join(notes)}: forward and backward scaled by "
                     f"--compute-scale {args.compute_scale:g}.")
    lines.append("- **micro-batch below / above measured**: no kernel was timed at that "
                 "micro-batch; t_c(b) = k·b^p is extrapolated.")
    return "\n".join(lines)


def _strong_end(study):
    end = int(study.global_batch // study.accum)
    measured = int(study.global_batch / study.accum // study.smallest_batch)
    return (f"{study.label}: the global batch of {study.global_batch:g} sequences gives one "
            f"sequence per GPU at N = {end}, where strong scaling ends; past N = {measured} "
            f"the micro-batch falls below the smallest measured ({study.smallest_batch:g}).")


def _json_value(value):
    """numpy scalars as Python's; anything else as its text."""
    return value.item() if hasattr(value, "item") else str(value)


def write_outputs(out, args, network, studies, predictions, take, ledger, now, left_out,
                  error, bench):
    """Writes predictions.csv, what-it-takes.csv, predictions.json, prediction.png,
    prediction.md and prediction.html under `out`; returns the summary text the CLI prints.
    bench (cli.BenchComm) names the bench comm files the collectives were calibrated with."""
    predictions.to_csv(out / "predictions.csv", index=False)
    take_rows = [{"strategy": label, "N": size, "efficiency_on_network": t["described"][size],
                  **{f"inter_gb_per_s_for_{int(100 * target)}": (None if t[target][size] is None
                                                                 else t[target][size] / 1e9)
                     for target in TAKE_TARGETS}}
                 for label, t in take.items() for size in TAKE_SIZES]
    import pandas as pd
    pd.DataFrame(take_rows).to_csv(out / "what-it-takes.csv", index=False)
    checks = [{k: v for k, v in s.check.items() if k not in ("model", "parts")}
              for s in studies if s.check]
    models = {s.label: {key: value for key, value in vars(s.model).items()
                        if key not in ("comm", "memory")} | {"comm": vars(s.model.comm)}
              for s in studies}
    described = {key: (None if value == math.inf else value) for key, value in vars(network).items()}
    document = {"made_utc": now, "sweep": str(args.sweep), "network": described,
                "level": args.level, "resamples": args.resamples,
                "bench_comm": bench.document(), "models": models,
                "held_out": checks, "model_error": _error_document(error),
                "what_it_takes": take_rows, "left_out": left_out,
                "predictions": predictions.to_dict(orient="records")}
    (out / "predictions.json").write_text(
        json.dumps(document, indent=1, default=_json_value) + "\n")
    plot_predictions(out / "prediction.png", studies, predictions,
          f"{Path(args.sweep).resolve().name} on {network.name}")
    notes = "\n".join(f"- **{s.label}**: " + "; ".join(s.model.notes) + "." for s in studies)
    text = "\n\n".join([
        f"# Scaling prediction: `{args.sweep}` on {network.name}",
        f"Made {now}. Intervals: {int(round(100 * args.level))} % nominal, the bootstrap over "
        f"the sweep's repeats ({args.resamples} resamples) combined with the model's own "
        "measured error, which grows with the extrapolation factor (\"The model's own "
        f"error\"). Network: `{args.network}` ({network.source}).",
        _bench_line(bench),
        "## Held-out check\n\nFitted on every N below the largest measured, then the largest "
        "predicted. Signed error = predicted / measured − 1 of the median step time.\n\n"
        + _check_section(studies),
        "## The model's own error\n\n" + _error_section(error, args.level),
        "## What was fitted\n\n" + notes + _left_out_section(left_out),
        "## Flags\n\n" + _flags_section(studies, network, args),
        "## Strong scaling\n\n" + "\n".join(f"- {_strong_end(s)}" for s in studies)
        + "\n\n* micro-batch below the smallest measured: extrapolated.\n\n" + _md_table(
            PREDICTION_HEADER, _prediction_rows(predictions, "strong")),
        "## Weak scaling\n\nEfficiency against one GPU at the same micro-batch.\n\n" + _md_table(
            PREDICTION_HEADER, _prediction_rows(predictions, "weak")),
        "## What would it take\n\n" + _take_section(take, network),
        "## Prediction ledger\n\n" + _ledger_section(ledger),
        "## What the model assumes and leaves out\n\n" + ASSUMES,
        "![prediction](prediction.png)"])
    (out / "prediction.md").write_text(text + "\n")
    write_html(out / "prediction.md")
    lines = [bench.describe(), f"held-out check ({network.name}):"]
    for study in studies:
        check = study.check
        lines.append(f"  {study.label}: " + ("one N measured, nothing held out" if check is None
                     else f"fit N={check['fit_N']} predict N={check['predicted_N']}: "
                     f"{100 * check['signed_error']:+.2f} %"))
    return "\n".join(lines + [f"wrote {out / 'prediction.md'}"])


def _bench_line(bench):
    """prediction.md's line on the bench comm files the collectives were calibrated with."""
    if bench.given:
        return ("Collectives calibrated with bench comm: "
                + ", ".join(f"`{p}`" for p in bench.paths) + " (`--bench-comm`).")
    if bench.paths:
        return (f"Collectives calibrated with bench comm: `{bench.paths[0]}`, the sweep's own "
                "(`--bench-comm` overrides it).")
    left_out = "".join(f"\n- left out: {line}" for line in bench.left_out)
    return (f"No bench comm file: none {'usable ' if bench.left_out else ''}in "
            f"`{bench.folder}`, where the sweep tool writes its bench comm point; the "
            "collectives are calibrated without one (\"What was fitted\")." + left_out)


def _error_document(error):
    inside, judged = error.coverage()
    return {"scale": error.scale, "t": error.quantile, "coverage_inside": inside,
            "coverage_judged": judged,
            "residuals": [{"strategy": r.strategy, "source": r.source, "N": r.size,
                           "fit_N": r.fit_sizes, "factor": r.factor,
                           "predicted_step_s": r.predicted_s, "measured_step_s": r.measured_s,
                           "inside_others_band": covered}
                          for r, covered in zip(error.residuals, error.covered)]}


def _left_out_section(left_out):
    if not left_out:
        return "\n\nEvery result file under the sweep entered the fit."
    return ("\n\nLeft out of the fit:\n\n" + "\n".join(f"- `{line}`" for line in left_out))
