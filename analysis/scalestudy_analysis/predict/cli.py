"""Command line: scalestudy-predict SWEEP --network FILE. Fits the scaling model to the
sweep, predicts every strategy from 1 to 4096 GPUs with intervals that include the
model's own measured error, checks itself on every N held out, keeps a ledger of its
predictions beside its output and scores them once a sweep measures the same workload at
that N on that network; writes predictions.csv/json, prediction.md and its HTML twin,
the "what would it take" table and prediction.png (predict/report.py writes them). The
collectives are calibrated with the --bench-comm files, or else with the bench comm file
the sweep tool wrote under SWEEP (bench-comm/n<N>.h5); the output names the one used."""
import argparse
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from scalestudy_analysis.report.cli import add_bootstrap_options
from scalestudy_analysis.predict import ledger as predict_ledger
from scalestudy_analysis.predict.error import ModelError
from scalestudy_analysis.predict.flags import FLAG_GPU, FLAG_MEMORY, gpu_mismatch, row_flags, scale_compute
from scalestudy_analysis.predict.report import TAKE_RANGE_BYTES_PER_S, TAKE_SIZES, TAKE_TARGETS, write_outputs
from scalestudy_analysis.predict.ledger import LEDGER_NAME

USAGE_ERROR = 2
CURVE_SIZES = tuple(2 ** i for i in range(13))          # 1 .. 4096
# The folder under a sweep where jobscripts/sweep.py writes its bench comm point, one
# file per rank count: n<N>.h5.
SWEEP_BENCH_COMM = "bench-comm"


def parser():
    """The argparse parser of scalestudy-predict."""
    result = argparse.ArgumentParser(
        prog="scalestudy-predict",
        description="Fit a model of the training step (compute against micro-batch, "
                    "optimizer against the parameters it updates, collectives as the "
                    "tuning model of the NCCL version the files record times them, the "
                    "measured overlap, stragglers) to "
                    "the result files under SWEEP, and predict step time, tokens/s, strong "
                    "and weak efficiency, exposed communication and memory per GPU for "
                    "every strategy from 1 to 4096 GPUs on the network described by "
                    "--network. Each interval combines a bootstrap over the sweep's repeats "
                    "with the model's own error, measured by predicting every N of the "
                    "sweep from the others and by the scored ledger entries, and widened "
                    "with the factor by which N exceeds the largest N measured. Keeps "
                    "OUT/" + LEDGER_NAME + ": predictions for N not yet measured, keyed "
                    "by workload, network and NCCL version, scored when a later sweep "
                    "measures the same point on the same network.",
        epilog="Writes OUT/prediction.md, prediction.html, predictions.csv, predictions.json, "
               "what-it-takes.csv and prediction.png. Every result file left out of the "
               "fit is named on stderr and in prediction.md with the reason: failed and "
               "unfinished runs are left out; a file that does not read stops the fit "
               "(see --skip-unreadable). Exit status: 0 on success, 2 on bad arguments, "
               "a result file that does not read, or a SWEEP without usable result files.")
    result.add_argument("sweep", metavar="SWEEP", type=Path,
                        help="directory searched recursively for result files")
    result.add_argument("--network", metavar="FILE", type=Path, required=True,
                        help="network description (experiments/networks/*.ini): GPUs per "
                             "node, bandwidth per GPU inside and across nodes, the GPU's "
                             "model and memory, NVLS; latencies only for runs without NCCL")
    result.add_argument("--out", metavar="DIR", type=Path,
                        help="output directory (default: SWEEP's name + '-prediction', "
                             "beside SWEEP)")
    result.add_argument("--bench-comm", metavar="FILE", type=Path, action="append",
                        help="a `scalestudy bench comm` file; give it twice for one file "
                             "inside a node and one across nodes. Inside a node its times "
                             "give the per-call latency and the bus bandwidth instead of the "
                             "sweep's collective records; across nodes they calibrate the "
                             "network step's latency and one GPU's network bandwidth. "
                             "Default: the sweep's own, SWEEP/" + SWEEP_BENCH_COMM + "/n<N>.h5 "
                             "as the sweep tool writes it (of several, the most ranks that "
                             "reads), else none; the output names the file used")
    result.add_argument("--batch-sweep", metavar="DIR", type=Path,
                        help="result files of one-GPU runs at several batches of the same "
                             "model: their compute joins the fit of t_c(b)")
    result.add_argument("--weak-batch", metavar="B", type=float,
                        help="sequences per GPU per micro-batch of the weak-scaling "
                             "prediction (default: the largest micro-batch measured)")
    result.add_argument("--compute-scale", metavar="F", type=float,
                        help="forward and backward time on the network file's GPU over the "
                             "time on the GPU the sweep measured (0.5: twice as fast); lifts "
                             "the flag on compute measured on another GPU model. The fit and "
                             "its held-out checks stay on the measured GPU")
    add_bootstrap_options(result, resamples=200, level=0.9)
    result.add_argument("--ledger", metavar="FILE", type=Path,
                        help="the prediction ledger to read, score and extend (default: "
                             "OUT/" + LEDGER_NAME + ")")
    result.add_argument("--no-ledger", action="store_true",
                        help="neither read nor write a ledger")
    result.add_argument("--skip-unreadable", action="store_true",
                        help="leave out result files that do not read (truncated, altered, "
                             "of another schema) instead of refusing to fit: what they "
                             "measured is unknown, so the fit may lack a point or a repeat. "
                             "Default: refuse, naming each")
    return result


def _usage_error(message):
    print(f"scalestudy-predict: error: {message}", file=sys.stderr)
    return USAGE_ERROR


@dataclass
class Ledger:
    """The ledger's entries (None with --no-ledger) and where they are kept."""
    data: dict
    path: Path


class UnreadableFiles(Exception):
    """Result files that do not read, and no --skip-unreadable; the message names each."""


# What excludes a file that reads but measured nothing to fit: a run that failed, did not
# finish or has only warm-up steps. Its configuration is known, and so is what the fit
# lacks without it. Any other exclusion (a file truncated, altered or of another schema)
# hides what the file measured: it may have been a point or a repeat of the fit.
NOT_MEASURED = frozenset({"failed", "incomplete", "no measured steps"})


def _read_sweep(directory, name, skip_unreadable):
    """The runs under directory, and a line for each file left out. Raises UnreadableFiles
    for files that do not read unless skip_unreadable; warns on stderr for every file left
    out."""
    from scalestudy_analysis.results.load import load_results
    runs, _, _ = load_results(directory)
    left_out, unreadable = [], []
    for run in runs:
        for problem in (p for p in run.problems if p.excluded):
            line = f"{run.path}: {problem.kind}: {problem.message}"
            left_out.append(line)
            if problem.kind not in NOT_MEASURED:
                unreadable.append(line)
    if unreadable and not skip_unreadable:
        raise UnreadableFiles(
            f"{name} {str(directory)!r}: {len(unreadable)} result file(s) do not read, and "
            "what they measured may be a point of the fit (--skip-unreadable leaves them "
            "out):\n  " + "\n  ".join(unreadable))
    for line in left_out:
        print(f"scalestudy-predict: warning: left out of the fit: {line}", file=sys.stderr)
    return runs, left_out


def _check(args):
    """A message naming the bad option, or None."""
    from scalestudy_analysis.results.load import find_result_files
    if not args.sweep.is_dir():
        return f"SWEEP {str(args.sweep)!r} is not a directory"
    if not find_result_files(args.sweep):
        return f"SWEEP {str(args.sweep)!r} holds no result files (*.h5 or *.h5.partial)"
    if not args.network.is_file():
        return f"--network {str(args.network)!r} is not a file"
    for path in args.bench_comm or ():
        if not path.is_file():
            return f"--bench-comm {str(path)!r} is not a file"
    if args.batch_sweep is not None and not args.batch_sweep.is_dir():
        return f"--batch-sweep {str(args.batch_sweep)!r} is not a directory"
    if args.weak_batch is not None and not args.weak_batch > 0:
        return f"--weak-batch {args.weak_batch}: must be positive"
    if args.ledger is not None and args.no_ledger:
        return "--ledger and --no-ledger exclude each other"
    if args.ledger is not None and args.ledger.is_dir():
        return f"--ledger {str(args.ledger)!r} is a directory, not a file"
    if args.compute_scale is not None and not args.compute_scale > 0:
        return f"--compute-scale {args.compute_scale}: must be positive"
    if args.resamples < 20:
        return f"--resamples {args.resamples}: must be at least 20"
    if not 0.5 <= args.level < 1.0:
        return f"--level {args.level}: must lie in [0.5, 1)"
    return None


def _bench_durations(path, option="--bench-comm"):
    """What bench comm measured, as {"bench_durations": durations inside one node,
    "bench_inter": (durations, ranks per node, nodes) across nodes}, or a message naming
    the file after `option`. A file of one node gives the first from its world scope; a
    file across nodes the first from its intra_node scope and the second from its world
    scope (or, without one, its inter_node scope: one rank per node)."""
    import pandas as pd
    from scalestudy_analysis.bench.report import read_bench_file
    bench = read_bench_file(path)
    if not bench.usable or bench.name != "comm":
        why = next((f" ({p.kind}: {p.message})" for p in bench.problems if p.excluded), "")
        return None, f"{option} {str(path)!r} is not a usable `bench comm` file{why}"
    points = bench.points[bench.points["status"] == "ok"]
    world_size = int(bench.attrs.get("world_size", 0))
    nodes = int(bench.attrs.get("nodes", 1))

    def durations(scope):
        rows = points[(points["scope"] == scope) & (points["ranks"] >= 2)]
        return pd.DataFrame({"N": rows["ranks"].to_numpy(), "kind": rows["collective"].to_numpy(),
                             "payload_bytes": rows["bytes"].to_numpy(),
                             "seconds": rows["time_median_s"].to_numpy()})
    measured = {}
    if nodes == 1:
        measured["bench_durations"] = durations("world")
    else:
        measured["bench_durations"] = durations("intra_node")
        ranks_per_node = int(bench.attrs.get("ranks_per_node", max(1, world_size // nodes)))
        world, inter = durations("world"), durations("inter_node")
        measured["bench_inter"] = ((world, ranks_per_node, nodes) if not world.empty
                                   else (inter, 1, nodes))
    measured = {key: value for key, value in measured.items()
                if not (value[0] if isinstance(value, tuple) else value).empty}
    if world_size < 2 or not measured:
        return None, (f"{option} {str(path)!r}: needs ok points of two or more ranks "
                      f"(it has {world_size} ranks on {nodes} nodes)")
    return measured, None


def _bench_extra(paths):
    """fit_model's bench_durations (inside one node) and bench_inter (across nodes) from
    the --bench-comm files, or a message naming the file; one of each at most."""
    extra = {}
    for path in paths or ():
        measured, message = _bench_durations(path)
        if message:
            return None, message
        for key, value in measured.items():
            if key in extra:
                return None, (f"--bench-comm {str(path)!r}: a second file measures "
                              + ("inside one node" if key == "bench_durations"
                                 else "across nodes"))
            extra[key] = value
    return extra, None


@dataclass
class BenchComm:
    """The bench comm files the fit uses, and where they came from."""
    paths: list       # the files used; empty for none
    given: bool       # named by --bench-comm, else looked for under the sweep
    folder: Path      # where the sweep's own is looked for
    left_out: list    # why each file found there was not usable, naming it

    def describe(self):
        """One line naming the files the collectives are calibrated with, or saying that
        none was found."""
        if self.given:
            return ("bench comm: " + ", ".join(str(p) for p in self.paths)
                    + " (--bench-comm)")
        if self.paths:
            return (f"bench comm: {self.paths[0]}, the sweep's own (--bench-comm "
                    "overrides it)")
        if self.left_out:
            return (f"bench comm: none usable in {self.folder} ({len(self.left_out)} left "
                    "out, named on stderr); the collectives are calibrated without it")
        return (f"bench comm: none found in {self.folder} (the sweep tool writes n<N>.h5 "
                "there); the collectives are calibrated without it")

    def document(self):
        """The record of predictions.json."""
        return {"files": [str(p) for p in self.paths],
                "source": ("--bench-comm" if self.given else "sweep" if self.paths else None),
                "left_out": self.left_out}


def _sweep_bench_files(sweep):
    """The bench comm files of the sweep tool under sweep (SWEEP_BENCH_COMM/n<N>.h5), the
    most ranks first."""
    folder = sweep / SWEEP_BENCH_COMM
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = re.fullmatch(r"n(\d+)\.h5", path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def _bench_calibration(args):
    """(fit_model's bench keyword arguments, BenchComm, message naming a bad file or None):
    the --bench-comm files where given; otherwise the sweep's own bench comm file of the
    most ranks that is usable, each one that is not named on stderr, or none."""
    folder = args.sweep / SWEEP_BENCH_COMM
    if args.bench_comm:
        extra, message = _bench_extra(args.bench_comm)
        return extra, BenchComm(list(args.bench_comm), True, folder, []), message
    left_out = []
    for path in _sweep_bench_files(args.sweep):
        measured, message = _bench_durations(path, option="bench comm")
        if message is None:
            return measured, BenchComm([path], False, folder, left_out), None
        left_out.append(message)
        print(f"scalestudy-predict: warning: the sweep's {message}; not used", file=sys.stderr)
    return {}, BenchComm([], False, folder, left_out), None


def _batch_points(directory, reference, skip_unreadable):
    """(b, t_c) of the one-GPU runs under directory whose model, sequence and precision
    match the reference run's."""
    from scalestudy_analysis.predict.fit import summarize_run
    runs, _ = _read_sweep(directory, "--batch-sweep", skip_unreadable)
    keys = ("model", "seq", "precision")
    return [(s.micro_batch, s.compute_s) for s in
            (summarize_run(run) for run in runs if run.usable and run.world_size == 1
             and all(run.config.get(k) == reference.config.get(k) for k in keys))]


class Study:
    """One series of the sweep: its summaries, its fit, its bootstrap and its check."""

    def __init__(self, series, label, network, args, extra):
        from scalestudy_analysis.predict.fit import (bootstrap_models, fit_model, held_out, held_out_residuals,
                                  summarize_run)
        import numpy as np
        self.series = series
        self.label = label
        self.sharded = series.fields.get("strategy") == "zero2"
        self.summaries = [summarize_run(run) for run in series.runs]
        self.model = fit_model(self.label, self.sharded, self.summaries, network, **extra)
        rng = np.random.default_rng([args.seed, series.index])
        self.replicates = bootstrap_models(self.label, self.sharded, self.summaries, network,
                                           args.resamples, rng, **extra)
        self.check = held_out(self.label, self.sharded, self.summaries, network, extra)
        self.residuals = held_out_residuals(self.label, self.sharded, self.summaries, network,
                                            extra)
        self.largest_size = max(s.world_size for s in self.summaries)
        batches = ([s.micro_batch for s in self.summaries]
                   + [b for b, _ in extra.get("extra_compute", ())])
        self.smallest_batch, self.largest_batch = min(batches), max(batches)
        self.gpu_memory_bytes = network.gpu_memory_bytes
        self.gpu_note = gpu_mismatch(self.summaries, network)
        self.gpu_flag = self.gpu_note is not None and args.compute_scale is None
        if args.compute_scale is not None:
            # The fit and its checks stay on the measured GPU; predictions move to the
            # network's.
            self.model = scale_compute(self.model, args.compute_scale)
            self.replicates = [scale_compute(m, args.compute_scale) for m in self.replicates]
        self.accum = self.summaries[0].grad_accum
        first = series.runs[0]
        self.global_batch = float(first.config.get("global_batch", "nan"))
        self.weak_batch = args.weak_batch or self.largest_batch


# Widened by the model's measured error: the step and what follows from it alone.
WIDENED_KEYS = ("step_time_s", "tokens_per_s", "efficiency")


def _evaluate(study, sizes, scaling, level, network=None, intervals=True, error=None):
    """Rows of predictions with intervals (without: the fitted model alone); strong
    scaling stops where a GPU would get less than one sequence per micro-batch. error
    (predict_error.ModelError) widens the step's interval with the model's own error at
    the row's extrapolation factor."""
    import numpy as np
    from scalestudy_analysis.predict.error import widen
    from scalestudy_analysis.predict.model import predict_point
    comm_for = _comm_for(network)
    rows = []
    for size in sizes:
        batch = (study.global_batch / size / study.accum if scaling == "strong"
                 else study.weak_batch)
        if batch < 1:
            continue
        base_batch = study.global_batch / study.accum if scaling == "strong" else batch
        values = {}
        for model in [study.model] + (study.replicates if intervals else []):
            point = predict_point(model, size, batch, comm_for(model))
            one = predict_point(model, 1, base_batch, comm_for(model))["step_time_s"]
            ideal = one / size if scaling == "strong" else one
            point["efficiency"] = ideal / point["step_time_s"]
            for key in ("step_time_s", "tokens_per_s", "efficiency", "exposed_comm_s",
                        "memory_per_gpu_bytes"):
                values.setdefault(key, []).append(point[key])
            values.setdefault("_first", point)
        first = values.pop("_first")
        row = {"strategy": study.label, "scaling": scaling, "N": size, "micro_batch": batch,
               "beyond_measured_batch": batch < study.smallest_batch - 1e-9,
               "above_measured_batch": batch > study.largest_batch + 1e-9,
               "algorithms": first["algorithms"]}
        tail = (1.0 - level) / 2.0
        for key, samples in values.items():
            row[key] = samples[0]
            spread = samples[1:] or samples[:1]
            row[f"{key}_lo"], row[f"{key}_hi"] = (float(v) for v in np.quantile(
                spread, [tail, 1.0 - tail]))
        row["extrapolation_factor"] = max(1.0, size / study.largest_size)
        half_width = error.half_width(row["extrapolation_factor"]) if error else 0.0
        row["model_error_half_width"] = half_width
        for key in WIDENED_KEYS if intervals else ():
            row[f"{key}_lo"], row[f"{key}_hi"] = widen(row[key], row[f"{key}_lo"],
                                                       row[f"{key}_hi"], half_width)
        flags = row_flags(row, study)
        row["exceeds_gpu_memory"] = FLAG_MEMORY in flags
        row["compute_on_other_gpu"] = FLAG_GPU in flags
        row["flags"] = "; ".join(flags)
        rows.append(row)
    return rows


def _comm_for(network):
    if network is None:
        return lambda model: None
    from dataclasses import replace
    return lambda model: replace(model.comm,
                                 inter_bytes_per_s=network.inter_bandwidth_bytes_per_s)


def _what_it_takes(study, network, target):
    """The least inter-node bandwidth per GPU (bytes/s) that keeps weak efficiency at
    target, by bisection on a log scale between 0.1 GB/s and 10 TB/s; None where even
    10 TB/s does not (latency, the node's bus or the optimizer bound it)."""
    low, high = (math.log(bound) for bound in TAKE_RANGE_BYTES_PER_S)
    results = {}
    for size in TAKE_SIZES:
        def efficiency(log_bandwidth):
            probe = network.with_inter_bandwidth(math.exp(log_bandwidth))
            return _evaluate(study, [size], "weak", 0.9, probe, intervals=False)[0]["efficiency"]
        if efficiency(high) < target:
            results[size] = None
            continue
        a, b = low, high
        if efficiency(a) >= target:
            results[size] = math.exp(a)
            continue
        for _ in range(40):
            middle = 0.5 * (a + b)
            a, b = (a, middle) if efficiency(middle) >= target else (middle, b)
        results[size] = math.exp(b)
    return results


def _labels(series_list):
    """The strategy names the series, unless two series share it: then their scaling,
    batch and number tell them apart."""
    names = [series.strategy_label for series in series_list]
    return [name if names.count(name) == 1 else
            f"{name} {series.scaling} ({series.index})"
            for name, series in zip(names, series_list)]


def run(args):
    """Fits, predicts and writes the outputs for parsed arguments, updating the ledger, and
    prints the summary. Returns the exit status: 0, or 2 with a message on stderr for bad input."""
    import pandas as pd
    from scalestudy_analysis.results.metrics import group_series
    from scalestudy_analysis.predict.model import NetworkError, read_network
    try:
        network = read_network(args.network)
    except NetworkError as error:
        return _usage_error(str(error))
    extra, bench, message = _bench_calibration(args)
    if message:
        return _usage_error(message)
    try:
        runs, left_out = _read_sweep(args.sweep, "SWEEP", args.skip_unreadable)
        series_list, _ = group_series(runs)
        if not series_list:
            return _usage_error(f"SWEEP {str(args.sweep)!r} holds no usable run")
        if args.batch_sweep is not None:
            extra["extra_compute"] = _batch_points(args.batch_sweep, series_list[0].runs[0],
                                                   args.skip_unreadable)
    except UnreadableFiles as error:
        return _usage_error(str(error))
    if args.batch_sweep is not None and not extra["extra_compute"]:
        return _usage_error(f"--batch-sweep {str(args.batch_sweep)!r} holds no one-GPU "
                            "run of the sweep's model, sequence and precision")
    try:
        studies = [Study(series, label, network, args, extra)
                   for series, label in zip(series_list, _labels(series_list))]
    except NetworkError as error:
        return _usage_error(str(error))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = args.out or args.sweep.resolve().parent / f"{args.sweep.resolve().name}-prediction"
    ledger_path = None if args.no_ledger else (args.ledger or out / LEDGER_NAME)
    try:
        ledger = None if ledger_path is None else predict_ledger.read_ledger(ledger_path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return _usage_error(f"--ledger {str(ledger_path)!r}: cannot be read as a ledger "
                            f"({error}); --no-ledger leaves it out")
    residuals = [r for study in studies for r in study.residuals]
    if ledger is not None:
        predict_ledger.score(ledger, predict_ledger.measured_points(studies, network), now)
        residuals += predict_ledger.residuals(ledger)
    error = ModelError(residuals, args.level)
    rows = []
    for study in studies:
        for scaling in ("strong", "weak"):
            rows += _evaluate(study, CURVE_SIZES, scaling, args.level, error=error)
        if ledger is not None:
            # The fitted model's own terms, bench comm's calibration included.
            predict_ledger.record(ledger, study, _evaluate(
                study, predict_ledger.ahead(study), study.series.scaling, args.level,
                error=error), network, now)
    predictions = pd.DataFrame(rows)
    take = {}
    for study in studies:
        take[study.label] = {target: _what_it_takes(study, network, target)
                             for target in TAKE_TARGETS}
        take[study.label]["described"] = {
            size: _evaluate(study, [size], "weak", args.level, intervals=False)[0]["efficiency"]
            for size in TAKE_SIZES}
    if ledger is not None:
        try:
            predict_ledger.write_ledger(ledger_path, ledger)
        except OSError as problem:
            return _usage_error(f"--ledger {str(ledger_path)!r}: cannot be written ({problem})")
    out.mkdir(parents=True, exist_ok=True)
    summary = write_outputs(out, args, network, studies, predictions, take,
                            Ledger(ledger, ledger_path), now, left_out, error, bench)
    print(summary)
    return 0


def main(argv=None):
    """Runs scalestudy-predict on argv (default sys.argv[1:]) and returns the exit status: 0,
    or 2 on bad arguments or input."""
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    message = _check(args)
    if message:
        return _usage_error(message)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return _usage_error(f"--out {str(args.out)!r} exists and is not a directory")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
