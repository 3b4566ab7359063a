"""Loading: what is used, what is left out, and that every exclusion is named."""
import h5py
import numpy as np

from scalestudy_analysis.load import load_results, read_run
from scalestudy_analysis.metrics import group_series
from synth import base_config, write_run


def kinds(problems):
    return sorted(problem.kind for problem in problems)


def test_complete_file_summary_agrees_with_the_reference(tmp_path):
    step_times = np.array([[0.3, 0.31], [0.2, 0.25], [0.21, 0.2], [0.26, 0.24], [0.22, 0.23]])
    path = write_run(tmp_path / "run.h5", world_size=2, steps=5, step_times=step_times,
                     peak=10.0, peak_source="datasheet: test", backend="cuda")
    run = read_run(path)
    assert run.usable and run.problems == []
    assert run.summary["steps_measured"] == 4
    assert run.summary["step_time_median_s"] == np.median([0.25, 0.21, 0.26, 0.23])


def test_tampered_summary_is_reported_and_the_run_left_out(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=2, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle["summary"].attrs["step_time_median_s"] = 0.2
    run = read_run(path)
    assert not run.usable
    assert kinds(run.problems) == ["summary mismatch"] and run.problems[0].excluded
    assert "step_time_median_s" in run.problems[0].message


def test_intervals_altered_in_place_are_refused(tmp_path):
    # The stored summary stays as written; the steps' intervals are stretched by 10 %, far
    # past the comparison's tolerance (schema.SUMMARY_RTOL).
    path = write_run(tmp_path / "run.h5", world_size=2, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle["steps/intervals"][...] = handle["steps/intervals"][...] * 1.1
    run = read_run(path)
    assert not run.usable
    assert kinds(run.problems) == ["summary mismatch"] and run.problems[0].excluded


def test_failed_and_partly_written_files_are_reported_and_excluded(tmp_path):
    write_run(tmp_path / "good.h5", world_size=2, step_times=0.1)
    write_run(tmp_path / "failed.h5", world_size=2, status="failed",
              failure_reason="rank 1 stuck in grad-comm")
    (tmp_path / "sub").mkdir()
    write_run(tmp_path / "sub" / "crashed.h5.partial", world_size=2, status="running", steps=3)
    write_run(tmp_path / "running.h5", world_size=2, status="running", steps=2)
    runs, frame, problems = load_results(tmp_path)
    assert len(runs) == 4 and len(frame) == 4
    assert kinds(problems) == ["failed", "incomplete", "incomplete"]
    by_file = {problem.where.rsplit("/", 1)[-1]: problem for problem in problems}
    assert "rank 1 stuck in grad-comm" in by_file["failed.h5"].message
    assert "3 steps recorded" in by_file["crashed.h5.partial"].message
    assert "running" in by_file["running.h5"].message
    assert all(problem.excluded for problem in problems)
    assert [run.path.endswith("good.h5") for run in runs if run.usable] == [True]
    series_list, _ = group_series(runs)
    assert [len(series.runs) for series in series_list] == [1]
    assert frame.set_index("path").loc["failed.h5", "included"] == False  # noqa: E712


def test_unreadable_and_incomplete_schema_files_are_named(tmp_path):
    (tmp_path / "garbage.h5").write_bytes(b"definitely not HDF5")
    path = write_run(tmp_path / "noloss.h5", world_size=1, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        del handle["steps/loss"]
    path = write_run(tmp_path / "v9.h5", world_size=1, step_times=0.1)
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = np.int64(9)
    _, _, problems = load_results(tmp_path)
    messages = {problem.where.rsplit("/", 1)[-1]: problem for problem in problems}
    assert messages["garbage.h5"].kind == "unreadable"
    assert messages["noloss.h5"].kind == "missing field"
    assert "/steps/loss" in messages["noloss.h5"].message
    assert messages["v9.h5"].kind == "schema"
    assert all(problem.excluded for problem in problems)


def test_mixed_git_sha_is_flagged_and_never_averaged(tmp_path):
    for n in (1, 2):
        write_run(tmp_path / f"old{n}.h5", world_size=n, step_times=0.2, git_sha="aaaa111")
    write_run(tmp_path / "new2.h5", world_size=2, step_times=0.1, git_sha="bbbb222",
              config=base_config(repeat=1))
    runs, _, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert kinds(problems) == ["mixed git_sha"]
    assert "aaaa111" in problems[0].message and "bbbb222" in problems[0].message
    assert sorted(len(series.runs) for series in series_list) == [1, 2]
    for series in series_list:
        assert len({run.git_sha for run in series.runs}) == 1


def test_mixed_config_is_flagged(tmp_path):
    write_run(tmp_path / "a.h5", world_size=1, step_times=0.2, config=base_config(hidden=64))
    write_run(tmp_path / "b.h5", world_size=2, step_times=0.1, config=base_config(hidden=128))
    runs, _, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert kinds(problems) == ["mixed config"]
    assert "hidden" in problems[0].message
    assert len(series_list) == 2


def test_repeats_and_batch_split_do_not_split_a_series(tmp_path):
    for n in (1, 2, 4):
        for repeat in (0, 1):
            write_run(tmp_path / f"n{n}r{repeat}.h5", world_size=n, step_times=0.1,
                      config=base_config(repeat=repeat, output=f"n{n}r{repeat}.h5",
                                         seed=repeat))
    runs, frame, _ = load_results(tmp_path)
    series_list, problems = group_series(runs)
    assert problems == [] and len(series_list) == 1
    assert sorted(frame["batch_per_rank"].astype(int).unique()) == [2, 4, 8]
    assert all(len(times) == 5 for times in frame["step_times_s"])


def test_benchmark_files_are_not_runs(tmp_path):
    import h5py
    from scalestudy_analysis.load import find_result_files
    with h5py.File(tmp_path / "gemm.h5", "w") as handle:
        handle.attrs["bench"] = "gemm"
        handle.attrs["status"] = "complete"
    (tmp_path / "broken.h5").write_bytes(b"not hdf5")
    assert [p.name for p in find_result_files(tmp_path)] == ["broken.h5"]
