"""The sweep tool: planning, Slurm scripts, and resuming an interrupted local sweep;
hostile experiment files, every field of [sweep] (its modules and containers included),
[train] and [env] carrying shell syntax, a continuation line or a %: each must be refused
with exit code 2, or give scripts in which nothing but the launchers run (the scripts are
run here with stub srun, mpirun, sbatch, module and apptainer, and a canary file that every
payload tries to create must not appear); the sweep checked
whole by the binary before anything is written; a file that does not read back redone;
and a local sweep stopped by a signal, and two sweeps on one folder, with the real
binary and mpirun."""
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import script_cli  # noqa: E402
import sweep  # noqa: E402
import sweep_experiment  # noqa: E402
import sweep_local  # noqa: E402
import sweep_plan  # noqa: E402
import sweep_slurm  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
needs_binary = pytest.mark.skipif(not BINARY, reason="needs SCALESTUDY_BINARY, the binary that checks each point")
needs_mpirun = pytest.mark.skipif(not BINARY or not shutil.which("mpirun"), reason="needs SCALESTUDY_BINARY and mpirun")


def write_experiment(tmp_path, sweep_lines, train_lines, env_lines=None):
    path = tmp_path / "experiment.ini"
    env = "" if env_lines is None else "[env]\n" + "\n".join(env_lines) + "\n"
    path.write_text("[sweep]\n" + "\n".join(sweep_lines) + "\n[train]\n" + "\n".join(train_lines) + "\n" + env)
    return path


def test_gpu_count_ranges_are_powers_of_two():
    assert sweep_experiment.parse_gpu_counts("1..8") == (1, 2, 4, 8)
    assert sweep_experiment.parse_gpu_counts("2..16") == (2, 4, 8, 16)
    assert sweep_experiment.parse_gpu_counts("1, 3, 6") == (1, 3, 6)
    with pytest.raises(script_cli.UsageError):
        sweep_experiment.parse_gpu_counts("0..4")


def test_plan_covers_every_point_once(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong, weak", "gpus = 1..4", "strategies = ddp, zero2",
                                       "overlap = off, on", "repeats = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 8", "batch-per-rank = 2"])
    points = sweep_plan.plan(sweep_experiment.read_experiment(path))
    assert len(points) == 2 * 3 * 2 * 2 * 2
    assert len({p.result for p in points}) == len(points)


def test_two_nodes_of_four_gpus_get_the_right_sbatch_lines(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 8", "gpus_per_node = 4", "strategies = zero2",
                                       "overlap = on", "backend = cuda", "time_limit = 01:30:00",
                                       "cpus_per_task = 6", "partition = gpu", f"output_dir = {tmp_path}/out"],
                            ["model = gpt2-small", "global-batch = 32", "precision = bf16"])
    experiment = sweep_experiment.read_experiment(path)
    (point,) = sweep_plan.plan(experiment)
    script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
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
    assert "--constraint" not in script and "--gpu-bind" not in script
    # A GPU point asks for whole nodes unless the file says otherwise.
    assert "\n#SBATCH --exclusive\n" in script
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--mpi=pmix" in launch and "--ntasks=8" in launch
    assert "--global-batch 32" in launch and "--strategy zero2" in launch and "--backend cuda" in launch
    assert "--batch-per-rank" not in launch


def test_the_multi_node_settings_reach_the_sbatch_script_and_mpirun(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 16", "gpus_per_node = 8", "ntasks_per_node = 4",
                                       "gpu_bind = none", "exclusive = yes", "constraint = h100&ib",
                                       "backend = cuda", f"output_dir = {tmp_path}/out"],
                            ["model = gpt2-small", "global-batch = 32"],
                            ["NCCL_NVLS_ENABLE = 1", "NCCL_IB_HCA = mlx5_0:1,mlx5_1:1", "NCCL_EMPTY ="])
    experiment = sweep_experiment.read_experiment(path)
    (point,) = sweep_plan.plan(experiment)
    script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    sbatch = re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M)
    assert ("nodes", "4") in sbatch, "16 ranks at 4 a node"
    assert ("ntasks-per-node", "4") in sbatch and ("gpus-per-node", "4") in sbatch
    assert ("exclusive", "") in sbatch and ("constraint", "h100&ib") in sbatch
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert launch.startswith("srun --mpi=pmix --gpu-bind=none --ntasks=16 ")
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    assert exports == ["export NCCL_NVLS_ENABLE=1", "export NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", "export NCCL_EMPTY=''"]
    assert script.index("export NCCL_EMPTY") < script.index("\nsrun "), "exported before the ranks start"
    command = sweep_local.local_command(experiment, point, Path("/opt/scalestudy"), "mpirun")
    assert command[:6] == ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "16"]
    assert command[6:12] == ["-x", "NCCL_NVLS_ENABLE=1", "-x", "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", "-x", "NCCL_EMPTY="]


def test_a_sweep_without_env_passes_mpirun_no_nccl_setting(tmp_path):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    experiment = sweep_experiment.read_experiment(path)
    (point,) = sweep_plan.plan(experiment)
    command = sweep_local.local_command(experiment, point, Path("/opt/scalestudy"), "mpirun")
    assert "-x" not in command and not any("NCCL" in arg for arg in command)
    assert experiment.ntasks_per_node == experiment.gpus_per_node == 1, "ranks per node follow GPUs per node"


def test_the_shipped_experiments_leave_nccl_its_defaults():
    # Some files there are `scalestudy train --config` files, with no [sweep].
    sweeps = [path for path in sorted((ROOT / "experiments").glob("*.ini")) if "[sweep]" in path.read_text()]
    assert len(sweeps) >= 2 and any(sweep_experiment.read_experiment(path).backend == "cuda" for path in sweeps)
    for path in sweeps:
        assert sweep_experiment.read_experiment(path).env == (), path


def test_cpu_points_ask_for_no_gpus(tmp_path):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    experiment = sweep_experiment.read_experiment(path)
    (point,) = sweep_plan.plan(experiment)
    assert "--gpus-per-node" not in sweep_slurm.sbatch_script(experiment, point, Path("/bin/true"))


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
    (["bench_comm = sometimes"], "bench_comm = 'sometimes'"),
    (["bench-comm = off"], "'bench-comm' in [sweep] (the [sweep] keys are written with _: bench_comm)"),
])
def test_bad_experiments_exit_2_naming_the_key(tmp_path, lines, fragment, capsys):
    path = write_experiment(tmp_path, lines, ["model = tiny", "global-batch = 8", "batch-per-rank = 2"])
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("env_lines, fragment", [
    (["1NCCL = x"], "[env] 1NCCL"),
    (["NCCL-DEBUG = INFO"], "[env] NCCL-DEBUG"),
    # Names that change which programs run, or load code, are refused.
    (["PATH = /tmp/evil"], "[env] PATH"),
    (["LD_PRELOAD = /tmp/evil.so"], "[env] LD_PRELOAD"),
    (["LD_LIBRARY_PATH = /tmp"], "[env] LD_LIBRARY_PATH"),
    (["BASH_ENV = /tmp/evil.sh"], "[env] BASH_ENV"),
    (["ENV = /tmp/evil.sh"], "[env] ENV"),
    (["IFS = x"], "[env] IFS"),
    (["PYTHONPATH = /tmp"], "[env] PYTHONPATH"),
    (["PYTHONSTARTUP = /tmp/evil.py"], "[env] PYTHONSTARTUP"),
    (["SHELLOPTS = xtrace"], "[env] SHELLOPTS"),
    (["nccl_debug = INFO"], "[env] nccl_debug"),
    (["NCCL_NET_PLUGIN = evil"], "[env] NCCL_NET_PLUGIN"),
    (["FI_PROVIDER_PATH = /tmp"], "[env] FI_PROVIDER_PATH"),
    (["OMPI_MCA_plm_rsh_agent = /tmp/evil"], "[env] OMPI_MCA_plm_rsh_agent"),
])
def test_a_bad_env_name_exits_2_naming_it(tmp_path, env_lines, fragment, capsys):
    path = write_experiment(tmp_path, ["scaling = weak"], ["model = tiny", "batch-per-rank = 2"], env_lines)
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert fragment in capsys.readouterr().err


def test_the_library_settings_of_env_are_taken(tmp_path):
    names = ["NCCL_DEBUG", "UCX_TLS", "OMPI_MCA_btl", "PMIX_MCA_gds", "FI_PROVIDER", "CUDA_DEVICE_MAX_CONNECTIONS",
             "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_LOG_LEVEL", "CUDNN_LOGLEVEL_DBG", "HCOLL_ENABLE_MCAST_ALL",
             "OMP_NUM_THREADS", "SCALESTUDY_X", "NCCL_LAUNCH_MODE", "CUDA_LAUNCH_BLOCKING"]
    path = write_experiment(tmp_path, ["scaling = weak"], ["model = tiny", "batch-per-rank = 2"],
                            [f"{name} = 1" for name in names])
    assert [name for name, _ in sweep_experiment.read_experiment(path).env] == names


def test_a_default_section_is_refused(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak"], ["model = tiny", "batch-per-rank = 2"])
    path.write_text("[DEFAULT]\nPATH = /tmp\n" + path.read_text())
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "[DEFAULT]" in capsys.readouterr().err


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
    experiment = sweep_experiment.read_experiment(path)
    points = sweep_plan.plan(experiment)
    # "Interrupt" after the first two points by running only those.
    failures = sweep_local.run_local(experiment, points[:2], Path(BINARY), "mpirun")
    assert failures == []
    done = {p.result: p.result.stat().st_mtime_ns for p in points[:2]}
    command = [sys.executable, str(ROOT / "jobscripts" / "sweep.py"), str(path), "--binary", BINARY,
               "--no-report"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    # The two missing points and the bench comm point.
    assert "2 of 5 point(s) already complete" in out.stdout
    assert out.stdout.count("... complete") == 3
    for result, mtime in done.items():
        assert result.stat().st_mtime_ns == mtime, f"{result} was run again"
    assert all(sweep_plan.result_status(p.result) == "complete"
               for p in points + sweep_plan.bench_comm_points(experiment))
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert "5 of 5 point(s) already complete" in again.stdout


def test_a_gpu_subset_and_another_output_folder(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 1..8", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    assert sweep.main([str(path), "--dry-run", "--gpus", "1..4", "--output-dir", str(tmp_path / "elsewhere")]) == 0
    plan = capsys.readouterr().out
    assert "n4-r0" in plan and "n8-r0" not in plan
    assert str(tmp_path / "elsewhere") in plan
    assert sweep.main([str(path), "--dry-run", "--gpus", "3"]) == 2
    assert "--gpus 3" in capsys.readouterr().err


# ---- the bench comm point ----------------------------------------------------------------

def test_a_sweep_carries_one_bench_comm_point_at_its_largest_gpu_count(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1..4", "ntasks_per_node = 2",
                                       "strategies = ddp, zero2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 8", "comm-timeout = 60"])
    experiment = sweep_experiment.read_experiment(path)
    (bench,) = sweep_plan.bench_comm_points(experiment)
    assert bench.ranks == 4 and bench.label() == "bench-comm-n4"
    assert bench.result == tmp_path / "out" / "bench-comm" / "n4.h5"
    assert bench.result not in {point.result for point in sweep_plan.plan(experiment)}
    # Placed as the 4-rank training points are: two nodes of two ranks, so every scope.
    assert sweep_plan.bench_comm_scopes(experiment, bench) == ["world", "intra_node", "inter_node"]
    script = sweep_slurm.sbatch_script(experiment, bench, Path("/opt/scalestudy"))
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))
    assert sbatch["nodes"] == "2" and sbatch["ntasks-per-node"] == "2"
    assert sbatch["job-name"] == "experiment-bench-comm-n4"
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    words = shlex.split(launch)
    assert words[:4] == ["srun", "--mpi=pmix", "--ntasks=4", "/opt/scalestudy"]
    args = words[4:]
    value = {name: args[args.index(name) + 1] for name in args if name.startswith("--")}
    assert args[:2] == ["bench", "comm"] and value["--backend"] == "cpu"
    assert value["--scopes"] == "world,intra_node,inter_node" and value["--output"] == str(bench.result)
    # Short on the cpu: payloads to 1 MiB, three timed samples; [train]'s comm-timeout holds too.
    assert value["--max-bytes"] == "1M" and value["--repeats"] == "3" and value["--comm-timeout"] == "60"
    assert "--global-batch" not in args and "--model" not in args
    command = sweep_local.local_command(experiment, bench, Path("/opt/scalestudy"), "mpirun")
    assert command[:6] == ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"]
    assert command[command.index("/opt/scalestudy") + 1:] == args
    # A subset of the GPU counts moves it to the subset's largest.
    subset = sweep.planned_sweep(sweep.argument_parser().parse_args([str(path), "--gpus", "1, 2"]))
    assert [point.ranks for point in sweep_plan.bench_comm_points(subset)] == [2]
    assert sweep_plan.bench_comm_scopes(subset, sweep_plan.bench_comm_points(subset)[0]) == ["world", "intra_node"]


def test_bench_comm_off_or_a_one_rank_sweep_has_no_bench_comm_point(tmp_path):
    off = write_experiment(tmp_path, ["scaling = weak", "gpus = 1, 2", "bench_comm = off"], ["batch-per-rank = 2"])
    assert sweep_plan.bench_comm_points(sweep_experiment.read_experiment(off)) == []
    one = write_experiment(tmp_path, ["scaling = weak", "gpus = 1"], ["batch-per-rank = 2"])
    assert sweep_plan.bench_comm_points(sweep_experiment.read_experiment(one)) == []


@needs_binary
def test_the_dry_run_and_the_slurm_scripts_include_the_bench_comm_point(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 1, 2", "ntasks_per_node = 2",
                                       f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    result = tmp_path / "out" / "bench-comm" / "n2.h5"
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 0
    plan = capsys.readouterr().out
    assert "3 point(s)" in plan
    (line,) = [line for line in plan.splitlines() if "bench comm" in line]
    assert "ranks=2" in line and "scopes=world,intra_node" in line and line.endswith(f"{result}  [missing]")
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY]) == 0
    capsys.readouterr()
    script = (tmp_path / "out" / "jobs" / "bench-comm-n2.sbatch").read_text()
    assert " bench comm --backend cpu " in script and f"--output {result} " in script
    path.write_text(path.read_text().replace("[train]", "bench_comm = off\n[train]"))
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 0
    plan = capsys.readouterr().out
    assert "2 point(s)" in plan and "bench comm" not in plan


@needs_mpirun
def test_a_local_sweep_writes_its_bench_comm_file_and_predict_calibrates_with_it(tmp_path):
    bench_report = pytest.importorskip("scalestudy_analysis.bench.report")
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 4", "steps = 4", "warmup-steps = 1", "seq = 16"])
    result = tmp_path / "out" / "bench-comm" / "n2.h5"
    out = subprocess.run(sweep_command(path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"\[3/3\] bench-comm-n2 \.\.\. complete in", out.stdout), out.stdout
    assert sweep_plan.result_status(result) == "complete"
    bench = bench_report.read_bench_file(result)
    assert bench.usable and bench.name == "comm" and int(bench.attrs["world_size"]) == 2, bench.problems
    world = bench.points[bench.points["scope"] == "world"]
    assert set(world["collective"]) == {"allreduce", "reduce_scatter", "allgather"}
    assert (world["status"] == "ok").all() and (world["ranks"] == 2).all()
    # Complete, it is skipped like any point.
    written = result.stat().st_mtime_ns
    again = subprocess.run(sweep_command(path), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "3 of 3 point(s) already complete" in again.stdout, again.stdout
    assert result.stat().st_mtime_ns == written
    # scalestudy-predict finds it under the sweep's folder and says so.
    network = tmp_path / "network.ini"
    network.write_text("[network]\nname = this machine\ngpus_per_node = 2\nintra_bandwidth_gb_per_s = 10\n"
                       "inter_bandwidth_gb_per_s = 1\nbase_latency_us = 0\nintra_latency_us = 0\n"
                       "inter_latency_us = 0\nsource = test\n")
    predict = subprocess.run([sys.executable, "-m", "scalestudy_analysis.predict.cli", str(tmp_path / "out"),
                              "--network", str(network), "--no-ledger", "--resamples", "20",
                              "--out", str(tmp_path / "prediction")], capture_output=True, text=True, timeout=300)
    assert predict.returncode == 0, predict.stdout + predict.stderr
    assert predict.stdout.splitlines()[0] == f"bench comm: {result}, the sweep's own (--bench-comm overrides it)"
    assert f"`{result}`" in (tmp_path / "prediction" / "prediction.md").read_text()


# ---- hostile experiment files ------------------------------------------------------------

BASE_SWEEP = {"name": "hostile", "scaling": "strong", "gpus": "1, 2", "gpus_per_node": "2",
              "strategies": "ddp", "overlap": "off", "repeats": "1", "backend": "cpu",
              "time_limit": "00:10:00", "cpus_per_task": "1", "srun_args": "--mpi=pmix",
              "partition": "debug", "account": "lab", "signal_before_limit_s": "60",
              "ntasks_per_node": "2", "exclusive": "yes", "constraint": "intel&ib", "qos": "normal",
              "reservation": "maint", "mem": "64G", "arrays": "off", "array_throttle": "2"}
BASE_TRAIN = {"model": "tiny", "global-batch": "8", "steps": "3", "lr": "0.001", "seed": "5", "data": "random"}
BASE_ENV = {"NCCL_DEBUG": "INFO"}
# The modules every hostile file loads, through the stub module.
MODULES_SWEEP = {"modules": "cuda/12.4, gcc+cuda/12.1", "module_purge": "yes"}
# Keys that only a cuda experiment may set, with the values it may take.
CUDA_SWEEP = {"gpu_bind": "none"}
# The keys of a pyxis container and of an Apptainer one (a sweep takes one or the other).
PYXIS_SWEEP = {"container_image": "nvcr.io#nvidia/pytorch:24.01-py3",
               "container_mounts": "/scratch:/scratch, /data:/data:ro+private", "container_workdir": "/scratch",
               "container_binary": "/opt/scalestudy/bin/scalestudy"}
APPTAINER_SWEEP = {"apptainer_image": "docker://nvcr.io/nvidia/pytorch@sha256:0a1b",
                   "container_mounts": "/scratch:/scratch, /data:/data:ro", "container_workdir": "/scratch",
                   "container_binary": "/opt/scalestudy/bin/scalestudy"}
CONTAINER_SWEEPS = {"pyxis": PYXIS_SWEEP, "apptainer": APPTAINER_SWEEP}
# What the stub module is asked, in every script and in the sweep's own load of the modules.
MODULE_CALLS = [["purge"], ["load", "cuda/12.4"], ["load", "gcc+cuda/12.1"]]
PAYLOADS = {"semicolon": "; touch {canary}", "substitution": "$(touch {canary})",
            "backticks": "`touch {canary}`", "continuation": "\n  touch {canary}",
            "percent": "%(touch {canary})s%", "quotes": "' \" $(touch {canary}) \" '"}


def write_values(tmp_path, sweep_values, train_values, env_values=None):
    """The experiment file of these values by section, its output_dir under tmp_path
    unless the values name one."""
    sweep_values = {"output_dir": str(tmp_path / "out"), **sweep_values}
    lines = ["[sweep]"] + [f"{key} = {value}" for key, value in sweep_values.items()]
    lines += ["[train]"]
    lines += [f"{key} = {value}" for key, value in train_values.items()]
    lines += ["[env]"] + [f"{key} = {value}" for key, value in (env_values or {}).items()]
    path = tmp_path / "experiment.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def stub_launchers(tmp_path):
    """A folder of stub srun, mpirun, sbatch, module and apptainer: each writes down its
    arguments, and what [env] exported, as the ranks would get them, and runs nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "mpirun", "sbatch", "module", "apptainer"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_CALLS/{name}.$$"\n'
                        f'printf "%s" "$NCCL_DEBUG" > "$STUB_CALLS/{name}-env.$$"\necho 1\n')
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def stub_calls(calls_dir, name):
    """The argument lists the stub `name` got, and the values of NCCL_DEBUG it saw."""
    return ([path.read_text().splitlines() for path in sorted(calls_dir.glob(f"{name}.*"))],
            [path.read_text() for path in sorted(calls_dir.glob(f"{name}-env.*"))])


def run_scripts(tmp_path, env):
    """Runs every point script with the stub launchers first on PATH."""
    for script in sorted((tmp_path / "out" / "jobs").glob("*.sbatch")):
        if script.name != "report.sbatch":
            subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, check=True, capture_output=True, timeout=30)


# The base files, with no payload: each must be taken, so that a refusal above is the
# payload's.
UNHARMED = "none"


def hostile_cases():
    for section in ("sweep", "sweep+pyxis", "sweep+apptainer"):
        yield section, "name", UNHARMED
    for key in list(BASE_SWEEP) + list(MODULES_SWEEP) + ["output_dir"]:
        for payload in PAYLOADS:
            yield "sweep", key, payload
    for key in BASE_TRAIN:
        for payload in PAYLOADS:
            yield "train", key, payload
    for payload in PAYLOADS:
        yield "train-key", "steps", payload
    for key in CUDA_SWEEP:
        for payload in PAYLOADS:
            yield "sweep-cuda", key, payload
    # SECTION+CONTAINER: the container's keys, and an [env] value that reaches the ranks as
    # written, in a sweep with that container.
    for container, values in CONTAINER_SWEEPS.items():
        for payload in PAYLOADS:
            for key in values:
                yield f"sweep+{container}", key, payload
            yield f"env+{container}", "NCCL_DEBUG", payload
    for key in BASE_ENV:
        for payload in PAYLOADS:
            yield "env", key, payload
            yield "env-key", key, payload


def hostile_file(tmp_path, section, key, text):
    section, _, container = section.partition("+")
    sweep_values = dict(BASE_SWEEP, output_dir=str(tmp_path / "out"), **MODULES_SWEEP,
                        **CONTAINER_SWEEPS.get(container, {}))
    train_values, env_values = dict(BASE_TRAIN), dict(BASE_ENV)
    if section == "sweep-cuda":
        sweep_values.update(CUDA_SWEEP, backend="cuda")
    if section.startswith("sweep"):
        sweep_values[key] += text
    elif section == "train":
        train_values[key] += text
    elif section == "train-key":
        train_values[key + text] = train_values.pop(key)
    elif section == "env":
        env_values[key] += text
    else:
        env_values[key + text] = env_values.pop(key)
    return write_values(tmp_path, sweep_values, train_values, env_values), env_values


def container_words(container, out_dir):
    """(srun's pyxis options, the words that run a rank in Apptainer) of a hostile case's
    file, as the base values give them."""
    own = f"{out_dir}:{out_dir}"
    if container == "pyxis":
        return ([f"--container-image={PYXIS_SWEEP['container_image']}",
                 f"--container-mounts={own},/scratch:/scratch,/data:/data:ro+private", "--container-workdir=/scratch"],
                [])
    if container == "apptainer":
        return [], ["apptainer", "exec", "--bind", f"{own},/scratch:/scratch,/data:/data:ro", "--pwd", "/scratch",
                    APPTAINER_SWEEP["apptainer_image"]]
    return [], []


def check_launcher_calls(calls, binary, pyxis=(), apptainer=()):
    """Every launcher call runs the binary once, after options and numbers only, and the
    container's words exactly as the file gives them."""
    for args in calls:
        assert args.count(str(binary)) == 1
        program_at = args.index(str(binary))
        before = args[:program_at]
        if apptainer:
            assert before[-len(apptainer):] == list(apptainer), args
            before = before[:-len(apptainer)]
        assert [arg for arg in before if arg.startswith("--container")] == list(pyxis), args
        assert all(arg.startswith("-") or re.fullmatch(r"\d+|none|[A-Z_]+=.*", arg, re.S)
                   for arg in before), args


@needs_binary
@pytest.mark.parametrize("section,key,payload", list(hostile_cases()))
def test_a_hostile_value_is_refused_or_runs_nothing_but_the_stub_launchers(
        tmp_path, monkeypatch, capsys, section, key, payload):
    """Every key of every section with shell syntax, a continuation line or a %: the sweep
    exits 2 in one line, or its Slurm scripts (run with stub srun, mpirun, sbatch, module
    and apptainer first on PATH, and submitted through the stub sbatch) and its local run
    (with the stub mpirun; refused in a pyxis container) call the launchers and the stub
    module with the file's names and nothing else, the canary never made."""
    canary = tmp_path / "canary"
    path, env_values = hostile_file(tmp_path, section, key, PAYLOADS.get(payload, "").format(canary=canary))
    bin_dir, calls_dir = stub_launchers(tmp_path), tmp_path / "calls"
    calls_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_CALLS", str(calls_dir))
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    # `module` is the stub: no shell function of a real one, and no init script to find it.
    for name in list(os.environ):
        if name.startswith("BASH_FUNC_") or name in ("BASH_ENV", "MODULESHOME"):
            monkeypatch.delenv(name)
    binary = Path(BINARY).resolve()
    # In a container the points run the container's binary; the one here checks them.
    container = section.partition("+")[2]
    launched = CONTAINER_SWEEPS[container]["container_binary"] if container else str(binary)
    pyxis, apptainer = container_words(container, tmp_path / "out")
    code = sweep.main([str(path), "--launcher", "slurm", "--binary", str(binary), "--submit"])
    err = capsys.readouterr().err
    assert code == 0 or payload != UNHARMED, err
    if code == 2:
        assert err.startswith("sweep: error: EXPERIMENT") and "\n" not in err.rstrip("\n"), err
        assert not (tmp_path / "out").exists(), "refused before anything was written"
    else:
        assert code == 0, err
        submitted, _ = stub_calls(calls_dir, "sbatch")
        assert len(submitted) == 4, "two points, bench comm and the report"
        run_scripts(tmp_path, dict(os.environ))
        calls, exported = stub_calls(calls_dir, "srun")
        assert len(calls) == 3, "one srun per point"
        check_launcher_calls(calls, launched, pyxis, apptainer)
        # An [env] value reaches the ranks as it was written, shell syntax and all.
        assert exported == [env_values.get("NCCL_DEBUG", "")] * 3
        # The sweep's own load of the modules, then each script's.
        modules, _ = stub_calls(calls_dir, "module")
        assert sorted(modules) == sorted(MODULE_CALLS * 4), modules
        local = sweep.main([str(path), "--launcher", "local", "--mpirun", "mpirun", "--binary", str(binary),
                            "--no-report"])
        calls, _ = stub_calls(calls_dir, "mpirun")
        if pyxis:
            err = capsys.readouterr().err
            assert local == 2 and "container_image" in err and "--launcher slurm" in err, err
            assert calls == [], "a pyxis sweep runs nothing locally"
        else:
            assert local == 1, "the stub mpirun runs no point"
            assert len(calls) == 3, "one mpirun per point"
            check_launcher_calls(calls, launched, pyxis, apptainer)
            for args in calls:
                assert [args[i + 1] for i, arg in enumerate(args) if arg == "-x"] == \
                    [f"NCCL_DEBUG={env_values['NCCL_DEBUG']}"]
        assert not list(calls_dir.glob("apptainer.*")), "the stub launchers start no rank"
    assert not canary.exists(), "a payload ran"


def test_the_srun_options_are_split_and_requoted(tmp_path):
    values = dict(BASE_SWEEP, srun_args="--mpi=pmix --cpu-bind=cores")
    experiment = sweep_experiment.read_experiment(write_values(tmp_path, values, BASE_TRAIN))
    assert experiment.srun_args == ("--mpi=pmix", "--cpu-bind=cores")
    point = sweep_plan.plan(experiment)[0]
    script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    assert "\nsrun --mpi=pmix --cpu-bind=cores --ntasks=1 /opt/scalestudy train " in script
    assert "#SBATCH --signal=TERM@60" in script


@pytest.mark.parametrize("key,value,message", [
    ("srun_args", "--mpi=pmix; touch x", "srun options only"),
    ("srun_args", "--mpi=pmix 'unclosed", "No closing quotation"),
    ("name", "my sweep", "letters, digits"),
    ("time_limit", "1 hour", "Slurm's time format"),
    ("partition", "gpu;debug", "partition names"),
    ("account", "$(id)", "letters, digits"),
    ("signal_before_limit_s", "-5", "not a whole number"),
    ("gpus_per_node", "2; x", "not a whole number"),
    ("ntasks_per_node", "$(id)", "not a whole number"),
    ("exclusive", "yes; touch x", "expected yes or no"),
    ("constraint", "intel;touch", "node features"),
    ("constraint", "intel & ib", "node features"),
])
def test_a_value_of_the_wrong_form_names_the_key(tmp_path, capsys, key, value, message):
    path = write_values(tmp_path, dict(BASE_SWEEP, **{key: value}), BASE_TRAIN)
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert key in err and message in err


def test_a_train_value_that_looks_like_an_option_is_refused(tmp_path, capsys):
    path = write_values(tmp_path, BASE_SWEEP, dict(BASE_TRAIN, steps="--output=/etc/passwd"))
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "[train] steps" in capsys.readouterr().err
    # A negative number is a value: the sweep passes it on, and the binary's check names it.
    path = write_values(tmp_path, BASE_SWEEP, dict(BASE_TRAIN, **{"warmup-steps": "-1"}))
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "[train] warmup-steps" not in err and "--warmup-steps -1: must be at least 0" in err, err


# ---- the sweep checked whole before anything is written -------------------------------

@needs_binary
def test_the_binary_says_what_it_can_run():
    out = subprocess.run([BINARY, "info", "--json"], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["backends"]["cpu"]["precisions"] == ["fp32"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"])
    presets = {preset["name"]: preset for preset in info["presets"]}
    # GPT-2 small's 124M parameters, and the text table's figures.
    assert 124e6 < presets["gpt2-small"]["parameters"] < 125e6
    table = subprocess.run([BINARY, "info"], capture_output=True, text=True, check=True).stdout
    for line in table.splitlines()[1:]:
        name, *_, parameters, gflop = line.split()
        assert presets[name]["parameters"] == int(parameters)
        # The table prints GFLOP to 4 significant digits: it agrees to within half of its last.
        last_digit = 10.0 ** -len(gflop.partition(".")[2])
        assert abs(presets[name]["train_flops_per_token"] / 1e9 - float(gflop)) <= last_digit / 2


@needs_binary
def test_a_point_that_would_not_start_stops_the_sweep_before_anything_is_written(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 7", "steps = 3"])
    for launcher in ("local", "slurm"):
        assert sweep.main([str(path), "--launcher", launcher, "--binary", BINARY]) == 2
        err = capsys.readouterr().err
        assert "point strong-ddp-overlap_off-n2-r0 (2 rank(s))" in err and "--global-batch 7" in err, err
        assert "n1-r0" not in err
        assert not (tmp_path / "out").exists()
    assert sweep.main([str(path), "--dry-run", "--binary", BINARY]) == 2, "a dry run checks the points too"
    assert "n2-r0" in capsys.readouterr().err


@needs_binary
@pytest.mark.parametrize("train_line, fragment", [
    ("lr = $(touch x)", "--lr"),
    ("seed = 5%", "--seed 5%"),
    ("model = gpt2-tiny", "--model"),
])
def test_train_values_are_checked_by_the_binary(tmp_path, capsys, train_line, fragment):
    path = write_experiment(tmp_path, ["scaling = weak", f"output_dir = {tmp_path}/out"],
                            ["batch-per-rank = 2", train_line])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "\n" not in err.rstrip("\n") and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@needs_binary
def test_a_cuda_experiment_is_refused_by_a_binary_without_cuda(tmp_path, capsys):
    info = json.loads(subprocess.run([BINARY, "info", "--json"], capture_output=True, text=True).stdout)
    if "cuda" in info["backends"]:
        pytest.skip("this binary has the cuda backend")
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", "backend = cuda",
                                       f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 8", "precision = bf16"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY]) == 2
    assert "backend = cuda, which" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_cuda_experiment_without_binary_never_takes_the_cpu_build(tmp_path):
    path = write_experiment(tmp_path, ["backend = cuda", "scaling = weak"], ["model = tiny", "batch-per-rank = 2"])
    experiment = sweep_experiment.read_experiment(path)
    args = sweep.argument_parser().parse_args([str(path)])
    cuda_build = ROOT / "build" / "cuda" / "scalestudy"
    if cuda_build.is_file():
        assert sweep.binary_of(args, experiment) == cuda_build.resolve()
    else:
        with pytest.raises(script_cli.UsageError, match="build/cuda/scalestudy: no such file"):
            sweep.binary_of(args, experiment)


def test_gpu_experiments_ask_for_whole_nodes_unless_the_file_says_otherwise(tmp_path):
    base = ["scaling = weak", "backend = cuda"]
    assert sweep_experiment.read_experiment(write_experiment(tmp_path, base, ["batch-per-rank = 2"])).exclusive
    assert not sweep_experiment.read_experiment(
        write_experiment(tmp_path, base + ["exclusive = no"], ["batch-per-rank = 2"])).exclusive
    assert not sweep_experiment.read_experiment(
        write_experiment(tmp_path, ["scaling = weak"], ["batch-per-rank = 2"])).exclusive


@needs_binary
def test_the_submit_hint_repeats_every_option_given(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 1, 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2"])
    given = [str(path), "--launcher", "slurm", "--binary", BINARY, "--output-dir", str(tmp_path / "else"),
             "--gpus", "2"]
    assert sweep.main(given) == 0
    (hint,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("submit them with: ")]
    words = shlex.split(hint[len("submit them with: "):])
    assert words[0].endswith("sweep.py") and words[1:] == given[:] + ["--submit"]


def test_the_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--help"])
    text = capsys.readouterr().out
    listed = re.split(r"\n(?:options|optional arguments):\n", text)[1]
    options = [" ".join(option.split()) for option in re.split(r"\n  (?=-)", "\n" + listed)[1:]]
    assert len(options) == 9
    for option in options:
        if not option.startswith("-h,"):
            assert "default: " in option, option


# ---- the skip logic: a file that does not read back is redone ------------------------------

def test_a_file_marked_complete_that_does_not_read_back_is_redone(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    import numpy as np
    path = tmp_path / "n1-r0.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["status"] = "complete"
        handle.create_dataset("steps/loss", data=np.arange(4096, dtype=np.float64), chunks=(1024,),
                              compression="gzip")
        offset = handle["steps/loss"].id.get_chunk_info(0).byte_offset
    assert sweep_plan.result_status(path) == "complete"
    # The first chunk's bytes overwritten, as a second writer would: the root still says complete.
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\xff" * 64)
    with h5py.File(path, "r") as handle:
        assert handle.attrs["status"] == "complete"
    status, why = sweep_plan.result_state(path)
    assert status == "unreadable" and why, why
    point = sweep_plan.Point("strong", "ddp", "off", 1, 0, path)
    assert sweep_plan.pending_points([point]) == [point]
    assert "does not read back" in capsys.readouterr().out


# ---- a local sweep that stops cleanly, and one sweep per output folder ---------------------

# Trials of a signal at a random time; more through the environment (20 for a release).
STOP_TRIALS = int(os.environ.get("SCALESTUDY_SWEEP_STOP_TRIALS", "3"))


def processes_naming(text):
    """The live processes whose command line holds text (every rank names its output)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                if stat_file.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if text.encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def sweep_command(path):
    return [sys.executable, str(ROOT / "jobscripts" / "sweep.py"), str(path), "--binary", BINARY, "--no-report"]


def start_sweep(path):
    return subprocess.Popen(sweep_command(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_no_process_naming(text, seconds):
    deadline = time.monotonic() + seconds
    while processes_naming(text) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_naming(text)


def stop_test_experiment(tmp_path):
    return write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", "strategies = ddp, zero2",
                                       "bench_comm = off", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "global-batch = 4", "steps = 1000", "warmup-steps = 1", "seq = 16"])


@needs_mpirun
@pytest.mark.parametrize("trial", range(STOP_TRIALS))
def test_sigint_at_a_random_time_leaves_no_rank_and_no_file_that_looks_complete(tmp_path, trial):
    path = stop_test_experiment(tmp_path)
    points = sweep_plan.plan(sweep_experiment.read_experiment(path))
    out_dir = str(tmp_path / "out")
    running = start_sweep(path)
    # Anywhere from the checks before the first point to the last point's steps.
    delay_s = random.Random(trial).uniform(0.2, 6.0)
    time.sleep(delay_s)
    running.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    stdout, stderr = running.communicate(timeout=30)
    if running.returncode == 0:
        pytest.fail(f"the sweep ended before SIGINT at {delay_s:.1f} s: lengthen the points")
    assert running.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("sweep: stopped by SIGINT"), stderr
    survivors = wait_for_no_process_naming(out_dir, 10.0 - (time.monotonic() - signalled))
    assert not survivors, f"ranks {survivors} outlived the sweep by 10 s (SIGINT at {delay_s:.1f} s)"
    statuses = {point.label(): sweep_plan.result_status(point.result) for point in points}
    print(f"SIGINT at {delay_s:.1f} s: {statuses}")
    for point in points:
        # Complete (it finished before the signal), failed (the ranks marked it), or absent.
        status = statuses[point.label()]
        assert status in ("complete", "failed", "missing", "running"), (point.label(), status, stderr)
        if status == "running":
            assert not point.result.exists()
    again = subprocess.run(sweep_command(path), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(sweep_plan.result_status(point.result) == "complete" for point in points)


@needs_mpirun
def test_two_sweeps_on_one_folder_cannot_both_run(tmp_path):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", f"output_dir = {tmp_path}/out"],
                            ["model = tiny", "batch-per-rank = 2", "steps = 100000", "seq = 16"])
    first = start_sweep(path)
    lock = tmp_path / "out" / ".sweep.lock"
    deadline = time.monotonic() + 30
    while not (lock.exists() and "pid" in lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = subprocess.run(sweep_command(path), capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"pid {first.pid}" in second.stderr and socket.gethostname() in second.stderr, second.stderr
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=30)
    assert first.returncode == 143 and "Traceback" not in stderr, stderr
    assert not wait_for_no_process_naming(str(tmp_path / "out"), 10.0)
    (point,) = sweep_plan.plan(sweep_experiment.read_experiment(path))
    assert sweep_plan.result_status(point.result) in ("failed", "missing", "running")
    assert not point.result.exists() or sweep_plan.result_status(point.result) == "failed"


def test_the_report_after_the_points_names_its_path_once(tmp_path, capfd):
    # One run of the example dataset stands for a finished sweep's results.
    example = ROOT / "examples" / "gpt2-small-strong-4xh200" / "strong" / "ddp-overlap_on" / "n1-r0.h5"
    out_dir = tmp_path / "out"
    (out_dir / "strong").mkdir(parents=True)
    shutil.copy(example, out_dir / "strong" / example.name)
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1", f"output_dir = {out_dir}"],
                            ["model = tiny", "global-batch = 8"])
    finished = sweep_experiment.read_experiment(path)
    assert sweep_local.report_after_points(finished) == 0
    out = capfd.readouterr().out
    assert out.count("report.md") == 1 and f"report: {out_dir / 'report' / 'report.md'}" in out
