"""Warnings: more ranks (or the CPU backend's threads) than cores, unbound or shared
cores, an IQR over 5 % of the median, efficiency over 1.02, fewer than 3 repeats, a dirty
build; and the quickstart, sized for 2 cores, warns where it shares them."""
import configparser
import os
import shutil
import socket
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from scalestudy_analysis.report.cli import main
from synth import base_config, write_run

ROOT = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("SCALESTUDY_BINARY")
MPIEXEC = shutil.which("mpiexec")


def warnings_of(tmp_path, results=None):
    out = tmp_path / "out"
    assert main([str(results or tmp_path / "r"), "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    return report.split("## Warnings", 1)[1].split("\n## ", 1)[0]


def write_clean(root, **options):
    """Three quiet repeats at N = 1 and 2: nothing to warn about."""
    for n in (1, 2):
        for repeat in range(3):
            write_run(root / f"n{n}r{repeat}.h5", world_size=n, step_times=0.1 + 0.1 / n,
                      config=base_config(repeat=repeat), **options)


def test_a_quiet_well_placed_set_has_no_warning(tmp_path):
    write_clean(tmp_path / "r")
    assert warnings_of(tmp_path).strip().startswith("None:")


@pytest.mark.parametrize("options, kind, detail", [
    (dict(logical_cores=1), "oversubscribed", "2 ranks on `node00`, 1 cores"),
    (dict(logical_cores=3), "oversubscribed threads", "2 ranks on `node00`, 3 cores"),
    (dict(cpu_binding=["0-63", "0-63"]), "unbound", "2 of 2"),
    (dict(cpu_binding=["0-1", "1-2"]), "shared cores", "1 cores on node00"),
])
def test_ranks_and_threads_beyond_the_cores_and_bindings_are_flagged(tmp_path, options, kind, detail):
    write_clean(tmp_path / "r")
    write_run(tmp_path / "r" / "n2r3.h5", world_size=2, step_times=0.15,
              config=base_config(repeat=3), **options)
    warnings = warnings_of(tmp_path)
    assert f"**{kind}**" in warnings and f"N = 2 ({detail})" in warnings, warnings


def test_threads_are_not_flagged_on_gpus_and_unknown_cores_are(tmp_path):
    write_clean(tmp_path / "r", backend="cuda", logical_cores=3)
    assert warnings_of(tmp_path).strip().startswith("None:")
    shutil.rmtree(tmp_path / "r")
    shutil.rmtree(tmp_path / "out")
    write_clean(tmp_path / "r", schema_version=4, hostnames=None)
    warnings = warnings_of(tmp_path)
    assert "**cores unknown**" in warnings and "(6 runs)" in warnings


def test_a_file_without_cores_is_never_judged_by_the_machine_reading_it(tmp_path):
    # Written on a host of this machine's name, with more ranks than it has cores: the
    # file does not say how many cores its host had, so nothing is said but that.
    here, cores = socket.gethostname(), os.cpu_count()
    for n in (1, cores + 1):
        write_run(tmp_path / "r" / f"n{n}.h5", world_size=n, step_times=0.1, schema_version=4,
                  hostnames=[here] * n)
    warnings = warnings_of(tmp_path)
    assert "oversubscribed" not in warnings and "**cores unknown**" in warnings


def test_noise_superlinear_few_repeats_and_dirty_builds_are_flagged(tmp_path):
    steps = 13
    for repeat in range(3):
        # N = 1's 12 measured steps alternate 0.2 and 0.1 s: an IQR of 0.1 s around a
        # median of 0.15 s.
        write_run(tmp_path / "r" / f"n1r{repeat}.h5", world_size=1, steps=steps,
                  step_times=np.tile([0.1, 0.2], 7)[:steps], config=base_config(repeat=repeat),
                  git_dirty=1)
    # N = 2 takes 0.07 s: efficiency 0.15 / 0.07 / 2 = 1.07, from one repeat only.
    write_run(tmp_path / "r" / "n2r0.h5", world_size=2, steps=steps, step_times=0.07, git_dirty=1)
    warnings = warnings_of(tmp_path)
    assert "**noisy**" in warnings and "N = 1 (66.7 %)" in warnings
    assert "**superlinear**" in warnings and "N = 2 (1.071)" in warnings
    assert "**few repeats**" in warnings and "N = 2 (1)" in warnings
    assert "**dirty build**" in warnings and "`abc1234-dirty`" in warnings
    assert "N = 1 (3)" not in warnings  # three repeats are enough


def test_the_quickstart_fits_two_cores_and_is_long_enough_to_time():
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    parser.read(ROOT / "experiments" / "quickstart.ini")
    sweep, train = parser["sweep"], parser["train"]
    assert max(int(n) for n in sweep["gpus"].split(",")) <= 2
    assert int(sweep["repeats"]) >= 3
    assert int(train["steps"]) - int(train["warmup-steps"]) >= 20


@pytest.mark.skipif(not (BINARY and MPIEXEC), reason="set SCALESTUDY_BINARY; needs mpiexec")
def test_the_quickstart_on_this_machine_warns_when_its_threads_outnumber_the_cores(tmp_path):
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    parser.optionxform = str
    parser.read(ROOT / "experiments" / "quickstart.ini")
    train = [item for key, value in parser["train"].items() if key != "batch-per-rank"
             for item in (f"--{key}", value)]
    for n in (1, 2):
        subprocess.run([MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-np", str(n), BINARY,
                        "train", *train, "--strategy", "ddp", "--overlap", "on",
                        "--output", str(tmp_path / "r" / f"n{n}.h5")],
                       check=True, capture_output=True, timeout=600)
    warnings = warnings_of(tmp_path)
    assert "**few repeats**" in warnings
    with h5py.File(tmp_path / "r" / "n2.h5", "r") as handle:
        recorded = "logical_cores" in handle["ranks"]
    if not recorded:
        # A writer before schema version 5: the cores are unknown, and the report says so.
        assert "**cores unknown**" in warnings and "oversubscribed" not in warnings
        return
    threads_fit = 2 * 2 <= (os.cpu_count() or 1)
    assert ("**oversubscribed threads**" in warnings) != threads_fit, warnings
    assert "| **oversubscribed** |" not in warnings  # two ranks on this machine's cores


def test_a_cpu_study_says_what_it_can_and_cannot_show(tmp_path):
    write_clean(tmp_path / "cpu")
    write_clean(tmp_path / "gpu", backend="cuda")
    for name in ("cpu", "gpu"):
        assert main([str(tmp_path / name), "-o", str(tmp_path / f"out-{name}")]) == 0
    cpu = (tmp_path / "out-cpu" / "report.md").read_text()
    assert "## What a CPU study can show" in cpu and "It does not show GPU figures" in cpu
    assert "## What a CPU study can show" not in (tmp_path / "out-gpu" / "report.md").read_text()


def test_unbound_ranks_are_not_also_said_to_share_cores(tmp_path):
    # Both ranks may run on all 4 cores: unbound, which is one warning, not two.
    write_clean(tmp_path / "r", logical_cores=4)
    write_run(tmp_path / "r" / "n2r3.h5", world_size=2, step_times=0.15, logical_cores=4,
              config=base_config(repeat=3), cpu_binding=["0-3", "0-3"])
    warnings = warnings_of(tmp_path)
    assert "**unbound**" in warnings and "shared cores" not in warnings
