import re
import sys
from pathlib import Path

import pytest

# The synthetic-file writer lives next to the tests, not in the package.
sys.path.insert(0, str(Path(__file__).parent))

from scalestudy_analysis.results.load import read_run  # noqa: E402
from synth import changed_file  # noqa: E402


@pytest.fixture
def read_with_one_gpu_problem():
    """Reads the run at `path` after `change` has made one of its GPU datasets malformed,
    and checks what such a file always leaves: a usable run that keeps its measured steps,
    and one GPU-state problem, not excluded, whose message names `message`. Returns the run
    and the problem."""
    def read(path, change, message, steps_measured):
        run = read_run(changed_file(path, change))
        assert run.usable and run.summary["steps_measured"] == steps_measured
        (problem,) = run.problems
        assert problem.kind == "gpu state" and not problem.excluded
        assert message in problem.message
        return run, problem
    return read


@pytest.fixture
def unnamed_in_report_help():
    """The files in a report's output directory, figures aside, that `scalestudy-report
    --help` does not name: a user reads from the help what the command writes. A file of
    one series (its name holds the series' slug, `_s01-...`) counts as named where the
    help names it with `<series>` in the slug's place."""
    from scalestudy_analysis.report.cli import parser
    help_text = " ".join(parser().format_help().split())

    def unnamed(out_dir):
        names = (re.sub(r"_s\d+-[^.]+", "_<series>", path.name)
                 for path in Path(out_dir).iterdir() if path.suffix != ".png")
        return sorted(name for name in set(names) if name not in help_text)
    return unnamed


EXAMPLE_DATASET = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"


@pytest.fixture(scope="session")
def example_report(tmp_path_factory):
    """The report of the example dataset, built once for every test that reads it."""
    if not EXAMPLE_DATASET.is_dir():
        pytest.skip(f"{EXAMPLE_DATASET} is missing")
    from scalestudy_analysis.report.cli import main
    out = tmp_path_factory.mktemp("example-report")
    assert main([str(EXAMPLE_DATASET), "-o", str(out)]) == 0
    return out
