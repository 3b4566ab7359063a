"""The sweep tool: planning, Slurm scripts, and resuming an interrupted local sweep."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import sweep  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")


def write_experiment(tmp_path, sweep_lines, train_lines):
    path = tmp_path / "experiment.ini"
    path.write_text("[sweep]\n" + "\n".join(sweep_lines) + "\n[train]\n" + "\n".join(train_lines) + "\n")
    return path


def test_gpu_count_ranges_are_powers_of_two():
    assert sweep.parse_gpu_counts("1..8") == (1, 2, 4, 8)
    assert sweep.parse_gpu_counts("2..16") == (2, 4, 8, 16)
    assert sweep.parse_gpu_counts("1, 3, 6") == (1, 3, 6)
    with pytest.raises(sweep.UsageError):
        sweep.parse_gpu_counts("0..4")


def test_plan_covers_every_point_once(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong, weak", "gpus = 1..4", "strategies = ddp, zero2",
                                       "overlap = off, on", "repeats = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 8", "batch-per-rank = 2"])
    points = sweep.plan(sweep.read_experiment(path))
    assert len(points) == 2 * 3 * 2 * 2 * 2
    assert len({p.result for p in points}) == len(points)


def test_two_nodes_of_four_gpus_get_the_right_sbatch_lines(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 8", "gpus_per_node = 4", "strategies = zero2",
                                       "overlap = on", "backend = cuda", "time_limit = 01:30:00",
                                       "cpus_per_task = 6", "partition = gpu", f"output_dir = {tmp_path}/out"],
                            ["model = gpt2-small", "global-batch = 32", "precision = bf16"])
    experiment = sweep.read_experiment(path)
    (point,) = sweep.plan(experiment)
    script = sweep.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))
    assert sbatch["nodes"] == "2"
    assert sbatch["ntasks-per-node"] == "4"
    assert sbatch["gpus-per-node"] == "4"
    assert sbatch["cpus-per-task"] == "6"
    assert sbatch["time"] == "01:30:00"
    assert sbatch["partition"] == "gpu"
    assert sbatch["output"].endswith("/logs/%x-%j.out")
    assert "export NCCL_NVLS_ENABLE=0" in script
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--mpi=pmix" in launch and "--ntasks=8" in launch
    assert "--global-batch 32" in launch and "--strategy zero2" in launch and "--backend cuda" in launch
    assert "--batch-per-rank" not in launch


def test_cpu_points_ask_for_no_gpus(tmp_path):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    experiment = sweep.read_experiment(path)
    (point,) = sweep.plan(experiment)
    assert "--gpus-per-node" not in sweep.sbatch_script(experiment, point, Path("/bin/true"))


@pytest.mark.parametrize("lines, fragment", [
    (["scaling = sideways"], "scaling = sideways"),
    (["gpus = many"], "gpus = many"),
    (["repeats = 0"], "repeats = 0"),
    (["colour = blue"], "colour"),
])
def test_bad_experiments_exit_2_naming_the_key(tmp_path, lines, fragment, capsys):
    path = write_experiment(tmp_path, lines, ["model = tiny", "global-batch = 8", "batch-per-rank = 2"])
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert fragment in capsys.readouterr().err


def test_strong_scaling_needs_a_global_batch(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = strong"], ["model = tiny"])
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "global-batch" in capsys.readouterr().err


@pytest.mark.skipif(not BINARY or not shutil.which("mpirun"), reason="needs SCALESTUDY_BINARY and mpirun")
def test_an_interrupted_sweep_runs_only_the_missing_points(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", "strategies = ddp, zero2",
                                       f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 4", "steps = 3", "warmup-steps = 1", "seq = 16"])
    experiment = sweep.read_experiment(path)
    points = sweep.plan(experiment)
    # "Interrupt" after the first two points by running only those.
    failures = sweep.run_local(experiment, points[:2], Path(BINARY), "mpirun")
    assert failures == []
    done = {p.result: p.result.stat().st_mtime_ns for p in points[:2]}
    command = [sys.executable, str(ROOT / "jobscripts" / "sweep.py"), str(path), "--binary", BINARY,
               "--no-report"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 of 4 point(s) already complete" in out.stdout
    assert out.stdout.count("... complete") == 2
    for result, mtime in done.items():
        assert result.stat().st_mtime_ns == mtime, f"{result} was run again"
    assert all(sweep.result_status(p.result) == "complete" for p in points)
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert "4 of 4 point(s) already complete" in again.stdout


def test_a_gpu_subset_and_another_output_folder(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 1..8", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    assert sweep.main([str(path), "--dry-run", "--gpus", "1..4", "--output-dir", str(tmp_path / "elsewhere")]) == 0
    plan = capsys.readouterr().out
    assert "n4-r0" in plan and "n8-r0" not in plan
    assert str(tmp_path / "elsewhere") in plan
    assert sweep.main([str(path), "--dry-run", "--gpus", "3"]) == 2
    assert "--gpus 3" in capsys.readouterr().err
