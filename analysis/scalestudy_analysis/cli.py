"""Command line: scalestudy-report RESULTS_DIR -o OUT_DIR."""
import argparse
import sys
from pathlib import Path

from . import __version__

USAGE_ERROR = 2


def parser():
    result = argparse.ArgumentParser(
        prog="scalestudy-report",
        description="Read every scalestudy result file (*.h5, and *.h5.partial left by runs "
                    "that did not finish) under RESULTS_DIR, recursively, and write "
                    "OUT_DIR/report.md (tables, figures, problems), OUT_DIR/runs.csv (one row "
                    "per file) and the figures as PNG files in OUT_DIR.",
        epilog="Failed, unfinished and unreadable files, and series that mix builds or "
               "configurations, are listed under Problems in the report and never averaged "
               "in. Exit status: 0 on success, 2 on bad arguments or when RESULTS_DIR holds "
               "no result files.")
    result.add_argument("results_dir", metavar="RESULTS_DIR", type=Path,
                        help="directory searched recursively for result files")
    result.add_argument("-o", "--out", dest="out_dir", metavar="OUT_DIR", type=Path,
                        required=True, help="directory for report.md, runs.csv and the PNGs "
                                            "(created if missing)")
    result.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return result


def _usage_error(message):
    print(f"scalestudy-report: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv=None):
    args = parser().parse_args(argv)
    from .load import find_result_files  # deferred: --help must not pay for h5py/pandas
    if not args.results_dir.is_dir():
        return _usage_error(f"RESULTS_DIR {str(args.results_dir)!r} is not a directory")
    if not find_result_files(args.results_dir):
        return _usage_error(f"RESULTS_DIR {str(args.results_dir)!r} holds no result files "
                            "(*.h5 or *.h5.partial)")
    if args.out_dir.exists() and not args.out_dir.is_dir():
        return _usage_error(f"OUT_DIR {str(args.out_dir)!r} exists and is not a directory")
    from .report import write_report
    report = write_report(args.results_dir, args.out_dir)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
