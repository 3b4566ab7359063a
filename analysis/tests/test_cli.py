"""The command line end to end, and its handling of bad input."""
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalestudy_analysis.report.cli import main
from synth import base_config, write_run

OVERVIEW_PNGS = {"strong_speedup.png", "strong_efficiency.png", "weak_efficiency.png",
                 "tokens_per_s.png", "comm_fraction.png", "mfu.png"}


def make_results(root):
    for n in (1, 2, 4):
        for repeat in (0, 1):
            write_run(root / "strong" / f"n{n}_r{repeat}.h5", world_size=n,
                      step_times=0.1 + 0.9 / n, backend="cuda", peak=989.0,
                      peak_source="datasheet: NVIDIA H100 bf16 dense",
                      config=base_config(repeat=repeat))
        write_run(root / "weak" / f"n{n}.h5", world_size=n, step_times=0.2 + 0.01 * n,
                  config=base_config(scaling="weak", strategy="zero2", overlap="on"))
    write_run(root / "failed.h5", world_size=2, status="failed",
              failure_reason="rank 1: collective allreduce timed out in grad-comm")
    write_run(root / "crashed.h5.partial", world_size=4, status="running", steps=2)
    return 6 + 3 + 2


def test_end_to_end_writes_report_csv_and_every_png(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    n_files = make_results(results)
    assert main([str(results), "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    linked = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report))
    written = {path.name for path in out.glob("*.png")}
    assert linked == written
    assert OVERVIEW_PNGS <= written
    assert len([name for name in written if name.startswith("breakdown_")]) == 2
    assert len([name for name in written if name.startswith("timeline_")]) == 2
    for section in ("## What was loaded", "## Series", "## Problems", "Baseline N0 = 1"):
        assert section in report
    problems = report.split("## Problems", 1)[1]
    assert "failed.h5" in problems and "timed out in grad-comm" in problems
    assert "crashed.h5.partial" in problems and "incomplete" in problems
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == n_files
    assert runs["included"].sum() == 9


def test_mfu_plot_is_skipped_with_a_note_without_a_peak(tmp_path):
    for n in (1, 2):
        write_run(tmp_path / "r" / f"{n}.h5", world_size=n, step_times=0.1)
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "mfu.png").exists()
    assert "MFU is undefined" in (tmp_path / "out" / "report.md").read_text()


def test_missing_results_dir_exits_2_naming_the_argument(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "-o", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert "RESULTS_DIR" in message and "nope" in message and "\n" not in message


def test_directory_without_result_files_exits_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing here")
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    assert "no result files" in capsys.readouterr().err


def test_module_entry_point_and_help(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "scalestudy_analysis.report.cli", "--help"],
                               capture_output=True, text=True)
    assert completed.returncode == 0 and "RESULTS_DIR" in completed.stdout
    completed = subprocess.run([sys.executable, "-m", "scalestudy_analysis.report.cli",
                                str(tmp_path / "missing"), "-o", str(tmp_path / "out")],
                               capture_output=True, text=True)
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1


def test_missing_out_option_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as raised:
        main([str(tmp_path)])
    assert raised.value.code == 2


def test_a_symlink_loop_is_skipped_with_a_warning_naming_it(tmp_path, capsys):
    """Two names that point at each other hold no file: the report skips them, saying
    so once each, and reads the rest."""
    results = tmp_path / "results"
    for n in (1, 2):
        write_run(results / "strong" / f"{n}.h5", world_size=n, step_times=0.1)
    (results / "a.h5").symlink_to("b.h5")
    (results / "b.h5").symlink_to("a.h5")
    (results / "strong" / "here").symlink_to(".")
    assert main([str(results), "-o", str(tmp_path / "out")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    program = Path(sys.argv[0]).name
    assert sorted(warnings) == [f"{program}: warning: {results / loop}: skipped, a symlink "
                                "loop (Too many levels of symbolic links)"
                                for loop in ("a.h5", "b.h5")]
    assert "a.h5" not in (tmp_path / "out" / "report.md").read_text()
