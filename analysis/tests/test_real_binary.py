"""Reads a file written by the C++ binary. Skipped unless SCALESTUDY_BINARY points at
it; the lead extends the checks once the writer exists."""
import os
import subprocess

import pytest

from scalestudy_analysis.load import read_run

BINARY = os.environ.get("SCALESTUDY_BINARY")


@pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")
def test_file_from_the_cpp_writer_loads_and_its_summary_agrees(tmp_path):
    output = tmp_path / "run.h5"
    subprocess.run([BINARY, "train", "--model", "tiny", "--steps", "6", "--warmup-steps", "1",
                    "--output", str(output)], check=True, timeout=600)
    run = read_run(output)
    assert run.problems == [], [problem.line() for problem in run.problems]
    assert run.usable and run.summary["steps_measured"] == 5
