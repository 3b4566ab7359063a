"""scalestudy-report compare: a planted slowdown is found, the same data split in two is
no different, intervals are reproducible, and an undecided point says how many more
repeats would decide it."""
import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.compare.bootstrap import Ratio
from scalestudy_analysis.report.cli import main
from synth import base_config, write_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"
SIZES = (1, 2, 4)
STEPS, WARMUP = 21, 1
# GPU-like noise (the example sweep's steps have an IQR of 0.1–0.3 %): the ratio of two
# sets of 4 repeats × 20 steps then scatters by some 0.15 % (over 12 seeds), so a 2 %
# slowdown lies far from the ±1 % band, and the two halves of one set well inside it.
STEP_NOISE = 0.005     # relative spread of one step around its run's mean
REPEAT_NOISE = 0.001   # relative spread of one repeat's mean around the point's
ESTIMATE_TOLERANCE = 0.006   # 4 times that scatter
SLOWDOWN = 1.02


def step_time(n):
    return 0.02 + 0.18 / n


def write_set(root, repeats, rng, factor=1.0, names=None):
    """repeats runs per N whose step times scatter around factor × step_time(N); names
    maps a repeat to its file's repeat index (default: itself)."""
    for n in SIZES:
        for repeat in repeats:
            mean = factor * step_time(n) * (1 + REPEAT_NOISE * rng.standard_normal())
            times = mean * (1 + STEP_NOISE * rng.standard_normal(STEPS))
            index = names(repeat) if names else repeat
            write_run(root / f"n{n}-r{index}.h5", world_size=n, steps=STEPS, warmup_steps=WARMUP,
                      step_times=times, config=base_config(repeat=index, global_batch=16))


def compare(tmp_path, *sets, extra=()):
    out = tmp_path / "out"
    assert main(["compare", *map(str, sets), "-o", str(out), *extra]) == 0
    return out, pd.read_csv(out / "compare.csv")


def test_a_planted_2_percent_slowdown_is_found_at_every_n(tmp_path):
    rng = np.random.default_rng(1)
    write_set(tmp_path / "before", range(4), rng)
    write_set(tmp_path / "after", range(4), rng, factor=SLOWDOWN)
    out, rows = compare(tmp_path, tmp_path / "before", tmp_path / "after")
    assert rows["N"].tolist() == list(SIZES)
    assert (rows["verdict"] == "slower").all(), rows[["N", "throughput_ratio", "verdict"]]
    np.testing.assert_allclose(rows["throughput_ratio"], 1 / SLOWDOWN, rtol=ESTIMATE_TOLERANCE)
    assert (rows["throughput_ratio_ci_hi"] < 1 / (1 + 0.01)).all()
    assert (rows["step_time_ratio_ci_lo"] > 1).all()
    report = (out / "compare.md").read_text()
    assert "Verdicts on throughput: 3 slower." in report
    assert (out / "compare_after.png").stat().st_size > 0


def test_the_same_data_split_in_two_shows_no_difference(tmp_path):
    rng = np.random.default_rng(2)
    write_set(tmp_path / "all", range(8), rng)
    for half in ("even", "odd"):
        (tmp_path / half).mkdir()
    for path in (tmp_path / "all").glob("*.h5"):
        repeat = int(path.stem.split("-r")[1])
        shutil.copy(path, tmp_path / ("even" if repeat % 2 == 0 else "odd") / path.name)
    out, rows = compare(tmp_path, tmp_path / "even", tmp_path / "odd")
    assert (rows["verdict"] == "no difference").all(), rows[["N", "throughput_ratio_ci_lo",
                                                             "throughput_ratio_ci_hi"]]
    assert (rows["repeats_reference"] == 4).all() and (rows["repeats_compared"] == 4).all()
    efficiency = rows[rows["N"] > 1]
    assert ((efficiency["efficiency_ratio_ci_lo"] < 1) & (efficiency["efficiency_ratio_ci_hi"] > 1)).all()


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason=f"{EXAMPLE} is missing")
def test_a_slowdown_planted_in_the_real_sweep_is_found_and_its_ratio_is_exact(tmp_path):
    source = EXAMPLE / "strong" / "ddp-overlap_on"
    shutil.copytree(source, tmp_path / "a")
    shutil.copytree(source, tmp_path / "b")
    for path in (tmp_path / "b").glob("*.h5"):
        with h5py.File(path, "r+") as handle:
            handle["steps/intervals"][...] = handle["steps/intervals"][...] * SLOWDOWN
            for name in ("begin", "end", "wait_begin", "wait_end"):
                handle[f"collectives/{name}"][...] = handle[f"collectives/{name}"][...] * SLOWDOWN
            # A stored summary that disagrees with the steps marks a file altered, and the
            # report leaves it out: the planted files carry none, and are recomputed.
            del handle["summary"]
    out, rows = compare(tmp_path, tmp_path / "a", tmp_path / "b")
    assert (rows["verdict"] == "slower").all()
    # Every step is 2 % longer, so the pooled medians are too, exactly.
    np.testing.assert_allclose(rows["throughput_ratio"], 1 / SLOWDOWN, rtol=1e-9)
    np.testing.assert_allclose(rows["efficiency_ratio"].dropna(), 1.0, rtol=1e-9)


def test_the_same_seed_gives_the_same_intervals_and_another_seed_others(tmp_path):
    rng = np.random.default_rng(3)
    write_set(tmp_path / "a", range(3), rng)
    write_set(tmp_path / "b", range(3), rng)
    first = compare(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--seed", "7"])[1]
    shutil.rmtree(tmp_path / "out")
    again = compare(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--seed", "7"])[1]
    pd.testing.assert_frame_equal(first, again)
    shutil.rmtree(tmp_path / "out")
    other = compare(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--seed", "8"])[1]
    assert not np.allclose(first["throughput_ratio_ci_lo"], other["throughput_ratio_ci_lo"], rtol=0, atol=0)
    np.testing.assert_array_equal(first["throughput_ratio"], other["throughput_ratio"])
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert data["options"]["seed"] == 8 and len(data["rows"]) == len(SIZES)


def test_more_repeats_follow_the_interval_width_on_a_log_scale():
    # Estimate 0.995 in [0.98, 1.01] from 3 repeats, band ±1 %: undecided. The half-width
    # w = (ln 1.01 − ln 0.98) / 2 must shrink below |ln 0.995| to exclude 1, or below
    # ln 1.01 − |ln 0.995| to fit the band; the first needs fewer repeats:
    # 3 (w / |ln 0.995|)² = 27.2…, so 28 in all, 25 more.
    ratio = Ratio(0.995, 0.98, 1.01, 0.95)
    assert ratio.verdict(0.01) == "undecided"
    w = (math.log(1.01) - math.log(0.98)) / 2
    assert math.ceil(3 * (w / abs(math.log(0.995))) ** 2) == 28
    assert ratio.more_repeats(3, 0.01) == 25
    assert Ratio(0.97, 0.96, 0.98, 0.95).more_repeats(3, 0.01) == 0
    assert Ratio(0.97, 0.96, 0.98, 0.95).verdict(0.01) == "slower"
    assert Ratio(1.004, 1.001, 1.007, 0.95).verdict(0.01) == "no difference"
    assert Ratio(1.02, 1.012, 1.03, 0.95).verdict(0.01) == "faster"


def test_an_undecided_point_says_how_many_more_repeats_would_decide_it(tmp_path):
    # Two noisy repeats a side, 1.5 % apart: the interval spans 1 and leaves the band.
    rng = np.random.default_rng(4)
    noisy = dict(STEP_NOISE=0.08, REPEAT_NOISE=0.02)
    saved = {k: globals()[k] for k in noisy}
    globals().update(noisy)
    try:
        write_set(tmp_path / "a", range(2), rng)
        write_set(tmp_path / "b", range(2), rng, factor=1.015)
    finally:
        globals().update(saved)
    out, rows = compare(tmp_path, tmp_path / "a", tmp_path / "b")
    undecided = rows[rows["verdict"] == "undecided"]
    assert len(undecided) >= 1
    assert (undecided["more_repeats"] >= 1).all()
    assert "more per set" in (out / "compare.md").read_text()


def test_bad_compare_arguments_exit_2(tmp_path, capsys):
    write_run(tmp_path / "a" / "r.h5", world_size=1)
    assert main(["compare", str(tmp_path / "a"), "-o", str(tmp_path / "out")]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "nope"), "-o",
                 str(tmp_path / "out")]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--labels", "x",
                 "-o", str(tmp_path / "out")]) == 2
    assert "--labels" in capsys.readouterr().err


def test_experiment_files_stand_for_their_sweeps_results(tmp_path):
    rng = np.random.default_rng(5)
    write_set(tmp_path / "results" / "before", range(3), rng)
    write_set(tmp_path / "results" / "after", range(3), rng, factor=SLOWDOWN)
    (tmp_path / "experiments").mkdir()
    for name in ("before", "after"):
        (tmp_path / "experiments" / f"{name}.ini").write_text(
            f"[sweep]\nname = {name}\noutput_dir = results/{name}\n[train]\nmodel = tiny\n")
    out, rows = compare(tmp_path, tmp_path / "experiments" / "before.ini",
                        tmp_path / "experiments" / "after.ini")
    assert (rows["verdict"] == "slower").all() and set(rows["compared"]) == {"after"}
    assert main(["compare", str(tmp_path / "experiments" / "before.ini"),
                 str(tmp_path / "nothing.ini"), "-o", str(tmp_path / "o2")]) == 2


@pytest.mark.parametrize("change", [{"global_batch": 32}, {"seq": "128"}, {"precision": "bf16"},
                                    {"grad_accum": "2"}, {"hidden": "128"}])
def test_sets_that_ran_different_work_get_no_verdict(tmp_path, change):
    rng = np.random.default_rng(5)
    write_set(tmp_path / "before", range(2), rng)
    for n in SIZES:
        for repeat in range(2):
            config = base_config(repeat=repeat, global_batch=16)
            config.update({key: str(value) for key, value in change.items()})
            write_run(tmp_path / "other" / f"n{n}-r{repeat}.h5", world_size=n, steps=STEPS,
                      warmup_steps=WARMUP, step_times=step_time(n) / 2, config=config)
    out, rows = compare(tmp_path, tmp_path / "before", tmp_path / "other")
    [key] = change
    assert (rows["verdict"] == "not comparable").all(), rows[["N", "verdict"]]
    assert rows["throughput_ratio"].isna().all() and rows["efficiency_ratio"].isna().all()
    assert rows["differs"].str.contains(f"{key}: ").all()
    report = (out / "compare.md").read_text()
    assert "Verdicts on throughput" not in report and "**faster**" not in report
    assert f"not comparable, different work ({key}: " in report
