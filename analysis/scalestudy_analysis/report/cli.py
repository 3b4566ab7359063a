"""Command line: scalestudy-report RESULTS_DIR -o OUT_DIR, and scalestudy-report compare
A B [C ...] -o OUT_DIR."""
import argparse
import configparser
import sys
from pathlib import Path

from scalestudy_analysis import __version__

USAGE_ERROR = 2


def parser():
    """The argparse parser of scalestudy-report (compare and trace have their own)."""
    result = argparse.ArgumentParser(
        prog="scalestudy-report",
        description="Read every scalestudy result file (*.h5, and *.h5.partial left by runs "
                    "that did not finish) under RESULTS_DIR, recursively, and write into "
                    "OUT_DIR: report.md (tables, figures, problems) and report.html, the same "
                    "report in one self-contained file; runs.csv (one row per file); "
                    "steps.csv, and steps.parquet where pyarrow is installed (one row per "
                    "step of every run used); "
                    "series.csv and series.json (one row per series and N: throughput, "
                    "speedup, efficiency, breakdown, communication, MFU, memory; columns "
                    "and units in docs/exports.md); the "
                    "figures as PNG files; and, where the runs recorded them, "
                    "gpu_state.csv, gpu_state_by_phase.csv, kernel_top.csv and "
                    "kernel_categories.csv; and trace_<series>.json, the timeline of each "
                    "series' drawn run for Perfetto. 'scalestudy-report trace RUN.h5' writes "
                    "one run's trace. "
                    "'scalestudy-report compare A B [C ...] -o OUT_DIR' compares result sets "
                    "(see 'scalestudy-report compare --help').",
        epilog="Failed, unfinished and unreadable files, and series that mix builds or "
               "configurations, are listed under Problems in the report and never averaged "
               "in. Exit status: 0 on success, 2 on bad arguments or when RESULTS_DIR holds "
               "no result files.")
    result.add_argument("results_dir", metavar="RESULTS_DIR", type=Path,
                        help="directory searched recursively for result files")
    result.add_argument("-o", "--out", dest="out_dir", metavar="OUT_DIR", type=Path,
                        required=True, help="directory for report.md, report.html, the "
                                            "CSV and JSON files and the PNGs (created if "
                                            "missing)")
    result.add_argument("--baseline", metavar="SERIES",
                        help="measure every series' efficiency also against one series' "
                             "smallest N: a series number as the report numbers them, a "
                             "strategy (ddp, zero2+overlap) or key=value pairs "
                             "(strategy=ddp,overlap=off); each series takes the match of its "
                             "model, scaling mode, sequence length and batch")
    result.add_argument("--bench", metavar="FILE", type=Path, nargs="+", default=(),
                        help="`scalestudy bench comm` files: their bus bandwidth at the "
                             "nearest size and the same world size is drawn beside each "
                             "collective's")
    result.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return result


def compare_parser():
    """The argparse parser of scalestudy-report compare."""
    result = argparse.ArgumentParser(
        prog="scalestudy-report compare",
        description="Compare result sets (directories of result files, searched recursively, "
                    "as for the report) with the first, A: for every (model, scaling, "
                    "strategy, N) measured in A and in another set, the ratios of throughput, "
                    "step time and efficiency with bootstrap intervals over repeats and steps, "
                    "a verdict (faster, slower, no difference, undecided) and how many more "
                    "repeats would decide an undecided point. Writes OUT_DIR/compare.md, "
                    "compare.csv, compare.json and one PNG of ratios against N per set.",
        epilog="A directory named compare is given as ./compare to the report itself. "
               "Exit status: 0 on success, 2 on bad arguments or a directory without result "
               "files.")
    result.add_argument("sets", metavar="DIR", type=Path, nargs="+",
                        help="result sets: directories, or experiment files (*.ini) for the "
                             "output_dir of their sweep; the first is the reference A (at "
                             "least two)")
    result.add_argument("-o", "--out", dest="out_dir", metavar="OUT_DIR", type=Path,
                        required=True, help="directory for compare.md and its files")
    result.add_argument("--labels", metavar="A,B,...", help="names of the sets, comma-separated "
                        "(default: the directories' names)")
    result.add_argument("--threshold", type=float, default=0.01,
                        help="half-width of the band around 1 inside which two sets count as "
                             "no different (default 0.01, 1 %%)")
    add_bootstrap_options(result, resamples=2000, level=0.95)
    return result


def add_bootstrap_options(parser, resamples, level):
    """--level, --resamples and --seed of the bootstrap intervals, with these defaults."""
    parser.add_argument("--level", type=float, default=level,
                        help=f"confidence level of the intervals (default {level})")
    parser.add_argument("--resamples", type=int, default=resamples,
                        help=f"bootstrap resamples per point (default {resamples})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the bootstrap: the same seed gives the same intervals")


def _check_results_dir(path, name):
    """A message naming what is wrong with a results directory, or None."""
    from scalestudy_analysis.results.load import find_result_files  # deferred: --help must not pay for h5py/pandas
    if not path.is_dir():
        return f"{name} {str(path)!r} is not a directory"
    if not find_result_files(path):
        return f"{name} {str(path)!r} holds no result files (*.h5 or *.h5.partial)"
    return None


def sweep_results_dir(experiment):
    """The results directory of an experiment file's sweep: its [sweep] output_dir
    (default results/<file name>), relative to the repository the file lies in (the
    folder above experiments/, as jobscripts/sweep.py reads it) or else to the current
    directory."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        parser.read(experiment)
    except configparser.Error as error:
        raise ValueError(f"{experiment}: {str(error).splitlines()[0]}") from None
    if not parser.has_section("sweep"):
        raise ValueError(f"{experiment}: no [sweep] section")
    output = Path(parser["sweep"].get("output_dir", f"results/{experiment.stem}").strip())
    if output.is_absolute():
        return output
    in_repository = experiment.resolve().parent.parent / output
    return in_repository if in_repository.is_dir() else output


def compare_main(argv):
    """Runs scalestudy-report compare on the arguments after `compare`; prints the path of
    compare.md and returns 0, or 2 on bad arguments."""
    args = compare_parser().parse_args(argv)
    if len(args.sets) < 2:
        return _usage_error("compare needs at least two result sets")
    try:
        args.sets = [sweep_results_dir(path) if path.suffix == ".ini" and path.is_file() else path
                     for path in args.sets]
    except ValueError as error:
        return _usage_error(str(error))
    labels = args.labels.split(",") if args.labels else None
    if labels is not None and (len(labels) != len(args.sets) or len(set(labels)) != len(labels)):
        return _usage_error(f"--labels {args.labels!r}: give {len(args.sets)} distinct names")
    if not 0.5 <= args.level < 1.0:
        return _usage_error(f"--level {args.level}: must lie in [0.5, 1)")
    if not 0.0 < args.threshold < 1.0:
        return _usage_error(f"--threshold {args.threshold}: must lie in (0, 1)")
    if args.resamples < 100:
        return _usage_error(f"--resamples {args.resamples}: must be at least 100")
    for path in args.sets:
        message = _check_results_dir(path, "DIR")
        if message:
            return _usage_error(message)
    if args.out_dir.exists() and not args.out_dir.is_dir():
        return _usage_error(f"OUT_DIR {str(args.out_dir)!r} exists and is not a directory")
    from scalestudy_analysis.compare.compare import write_compare
    print(write_compare(args.sets, args.out_dir, labels, level=args.level,
                        threshold=args.threshold, resamples=args.resamples, seed=args.seed))
    return 0


def trace_parser():
    """The argparse parser of scalestudy-report trace."""
    result = argparse.ArgumentParser(
        prog="scalestudy-report trace",
        description="Write a run's timeline as Chrome Trace Event JSON, which Perfetto "
                    "(ui.perfetto.dev) and chrome://tracing open: one process per rank; tracks "
                    "for the steps, the compute stream's phases, each comm-stream phase, the "
                    "collectives and, for runs made with --profile-kernels, each GPU stream's "
                    "kernels. Steps are laid end to end on each rank.",
        epilog="Exit status: 0 on success, 2 on bad arguments or a file without step intervals.")
    result.add_argument("run", metavar="RUN.h5", type=Path, help="a result file (.h5 or .h5.partial)")
    result.add_argument("-o", "--out", metavar="FILE.json", type=Path, default=None,
                        help="where to write the trace (default: RUN.trace.json beside the run)")
    return result


def trace_main(argv):
    """Runs scalestudy-report trace on the arguments after `trace`; prints the trace's path and
    returns 0, or 2 on bad arguments or a file without step intervals."""
    args = trace_parser().parse_args(argv)
    if not args.run.is_file():
        return _usage_error(f"RUN.h5 {str(args.run)!r} is not a file")
    from scalestudy_analysis.report.trace import TraceError, write_trace
    try:
        print(write_trace(args.run, args.out))
    except TraceError as error:
        return _usage_error(str(error))
    return 0


def _usage_error(message):
    print(f"scalestudy-report: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv=None):
    """Runs scalestudy-report on argv (default sys.argv[1:]), handing `compare` and `trace` to
    their commands; prints the report's path and returns 0, or 2 on bad input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    if argv[:1] == ["trace"]:
        return trace_main(argv[1:])
    args = parser().parse_args(argv)
    message = _check_results_dir(args.results_dir, "RESULTS_DIR")
    if message:
        return _usage_error(message)
    if args.out_dir.exists() and not args.out_dir.is_dir():
        return _usage_error(f"OUT_DIR {str(args.out_dir)!r} exists and is not a directory")
    for path in args.bench:
        if not path.is_file():
            return _usage_error(f"--bench {str(path)!r} is not a file")
    from scalestudy_analysis.results.baseline import BaselineError
    from scalestudy_analysis.report.report import write_report
    try:
        report = write_report(args.results_dir, args.out_dir, baseline=args.baseline,
                              bench_files=args.bench)
    except BaselineError as error:
        return _usage_error(str(error))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
