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


def write_experiment(tmp_path, sweep_lines, train_lines, env_lines=None):
    path = tmp_path / "experiment.ini"
    env = "" if env_lines is None else "[env]\n" + "\n".join(env_lines) + "\n"
    path.write_text("[sweep]\n" + "\n".join(sweep_lines) + "\n[train]\n" + "\n".join(train_lines) + "\n" + env)
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
    # Without [env] the job keeps NCCL's defaults, NVLS included.
    assert "NCCL" not in script
    assert "--exclusive" not in script and "--constraint" not in script and "--gpu-bind" not in script
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--mpi=pmix" in launch and "--ntasks=8" in launch
    assert "--global-batch 32" in launch and "--strategy zero2" in launch and "--backend cuda" in launch
    assert "--batch-per-rank" not in launch


def test_the_multi_node_settings_reach_the_sbatch_script_and_mpirun(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 16", "gpus_per_node = 8", "ntasks_per_node = 4",
                                       "gpu_bind = none", "exclusive = yes", "constraint = h100&ib",
                                       "backend = cuda", f"output_dir = {tmp_path}/out"],
                            ["model = gpt2-small", "global-batch = 32"],
                            ["NCCL_NVLS_ENABLE = 1", "NCCL_IB_HCA = mlx5_0:1,mlx5_1:1", "EMPTY ="])
    experiment = sweep.read_experiment(path)
    (point,) = sweep.plan(experiment)
    script = sweep.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    sbatch = re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M)
    assert ("nodes", "4") in sbatch, "16 ranks at 4 a node"
    assert ("ntasks-per-node", "4") in sbatch and ("gpus-per-node", "4") in sbatch
    assert ("exclusive", "") in sbatch and ("constraint", "h100&ib") in sbatch
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert launch.startswith("srun --mpi=pmix --gpu-bind=none --ntasks=16 ")
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    assert exports == ["export NCCL_NVLS_ENABLE=1", "export NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", "export EMPTY=''"]
    assert script.index("export EMPTY") < script.index("\nsrun "), "exported before the ranks start"
    command = sweep.local_command(experiment, point, Path("/opt/scalestudy"), "mpirun")
    assert command[:6] == ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "16"]
    assert command[6:12] == ["-x", "NCCL_NVLS_ENABLE=1", "-x", "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", "-x", "EMPTY="]


def test_a_sweep_without_env_passes_mpirun_no_nccl_setting(tmp_path):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    experiment = sweep.read_experiment(path)
    (point,) = sweep.plan(experiment)
    command = sweep.local_command(experiment, point, Path("/opt/scalestudy"), "mpirun")
    assert "-x" not in command and not any("NCCL" in arg for arg in command)
    assert experiment.ntasks_per_node == experiment.gpus_per_node == 1, "ranks per node follow GPUs per node"


def test_the_shipped_gpu_experiments_keep_nvls_off_and_the_cpu_ones_set_nothing():
    # Some files there are `scalestudy train --config` files, with no [sweep].
    sweeps = [path for path in sorted((ROOT / "experiments").glob("*.ini")) if "[sweep]" in path.read_text()]
    assert len(sweeps) >= 2
    for path in sweeps:
        experiment = sweep.read_experiment(path)
        if experiment.backend == "cuda":
            assert ("NCCL_NVLS_ENABLE", "0") in experiment.env, path
        else:
            assert experiment.env == (), path


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
    (["exclusive = maybe"], "exclusive = 'maybe'"),
    (["constraint = h100 ib"], "constraint = 'h100 ib'"),
    (["ntasks_per_node = 0"], "ntasks_per_node = 0"),
    (["backend = cuda", "gpus_per_node = 4", "ntasks_per_node = 8"], "ntasks_per_node = 8 is above gpus_per_node"),
    (["backend = cuda", "gpu_bind = closest"], "gpu_bind = 'closest'"),
    (["gpu_bind = none"], "gpu_bind = none: needs backend = cuda"),
])
def test_bad_experiments_exit_2_naming_the_key(tmp_path, lines, fragment, capsys):
    path = write_experiment(tmp_path, lines, ["model = tiny", "global-batch = 8", "batch-per-rank = 2"])
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("env_lines, fragment", [
    (["1NCCL = x"], "[env] 1NCCL"),
    (["NCCL-DEBUG = INFO"], "[env] NCCL-DEBUG"),
])
def test_a_bad_env_name_exits_2_naming_it(tmp_path, env_lines, fragment, capsys):
    path = write_experiment(tmp_path, ["scaling = weak"], ["model = tiny", "batch-per-rank = 2"], env_lines)
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert fragment in capsys.readouterr().err


def test_an_unknown_section_exits_2_naming_it(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak"], ["model = tiny", "batch-per-rank = 2"])
    path.write_text(path.read_text() + "[slurm]\nexclusive = yes\n")
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "[slurm]" in capsys.readouterr().err


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
