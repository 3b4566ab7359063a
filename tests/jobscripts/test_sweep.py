"""The sweep tool: planning, Slurm scripts, and resuming an interrupted local sweep; and
hostile experiment files, every field of [sweep], [train] and [env] carrying shell syntax
or a continuation line. Each must be refused with exit code 2, or give scripts in which
nothing but the intended commands run: the scripts are run here with a stub srun, and a
canary file that every payload tries to create must not appear."""
import os
import re
import shutil
import stat
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


def test_the_shipped_experiments_leave_nccl_its_defaults():
    # Some files there are `scalestudy train --config` files, with no [sweep].
    sweeps = [path for path in sorted((ROOT / "experiments").glob("*.ini")) if "[sweep]" in path.read_text()]
    assert len(sweeps) >= 2 and any(sweep.read_experiment(path).backend == "cuda" for path in sweeps)
    for path in sweeps:
        assert sweep.read_experiment(path).env == (), path


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


# ---- hostile experiment files ------------------------------------------------------------

BASE_SWEEP = {"name": "hostile", "scaling": "strong", "gpus": "1, 2", "gpus_per_node": "2",
              "strategies": "ddp", "overlap": "off", "repeats": "1", "backend": "cpu",
              "time_limit": "00:10:00", "cpus_per_task": "1", "srun_args": "--mpi=pmix",
              "partition": "debug", "account": "lab", "signal_before_limit_s": "60",
              "ntasks_per_node": "2", "exclusive": "yes", "constraint": "intel&ib"}
BASE_TRAIN = {"model": "tiny", "global-batch": "8", "steps": "3"}
BASE_ENV = {"NCCL_DEBUG": "INFO"}
# Keys that only a cuda experiment may set, with the values it may take.
CUDA_SWEEP = {"gpu_bind": "none"}
PAYLOADS = {"semicolon": "; touch {canary}", "substitution": "$(touch {canary})",
            "backticks": "`touch {canary}`", "continuation": "\n  touch {canary}"}


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


def stub_srun(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    # The arguments, and what [env] exported, as each rank would get them.
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS_FILE.$$"\n'
                    'printf "%s" "$NCCL_DEBUG" > "$SRUN_ENV_FILE.$$"\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def run_scripts(tmp_path, binary):
    """Runs every point script with the stub srun; returns the argument lists srun got,
    and the values of NCCL_DEBUG it saw."""
    bin_dir = stub_srun(tmp_path)
    args_file = tmp_path / "srun-args"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_ARGS_FILE=str(args_file),
               SRUN_ENV_FILE=str(tmp_path / "srun-env"))
    env.pop("NCCL_DEBUG", None)
    jobs = sorted((tmp_path / "out" / "jobs").glob("*.sbatch"))
    for script in jobs:
        if script.name != "report.sbatch":
            subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, check=True,
                           capture_output=True, timeout=30)
    return ([path.read_text().splitlines() for path in tmp_path.glob("srun-args.*")],
            [path.read_text() for path in tmp_path.glob("srun-env.*")])


def hostile_cases():
    for key in list(BASE_SWEEP) + ["output_dir"]:
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
    for key in BASE_ENV:
        for payload in PAYLOADS:
            yield "env", key, payload
            yield "env-key", key, payload


@pytest.mark.parametrize("section,key,payload", list(hostile_cases()))
def test_a_hostile_value_is_refused_or_runs_nothing_but_the_intended_commands(
        tmp_path, capsys, section, key, payload):
    canary = tmp_path / "canary"
    text = PAYLOADS[payload].format(canary=canary)
    sweep_values = dict(BASE_SWEEP, output_dir=str(tmp_path / "out"))
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
    path = write_values(tmp_path, sweep_values, train_values, env_values)
    binary = tmp_path / "scalestudy"
    binary.write_text("#!/bin/sh\nexit 0\n")
    code = sweep.main([str(path), "--launcher", "slurm", "--binary", str(binary)])
    err = capsys.readouterr().err
    if code == 2:
        assert err.startswith("sweep: error: EXPERIMENT") and "\n" not in err.rstrip("\n")
    else:
        assert code == 0
        calls, exported = run_scripts(tmp_path, binary)
        assert len(calls) == 2, "one srun per point"
        for args in calls:
            assert args.count(str(binary)) == 1
            program_at = args.index(str(binary))
            assert all(arg.startswith("-") for arg in args[:program_at]), args
        # An [env] value reaches the ranks as it was written, shell syntax and all.
        assert exported == [env_values.get("NCCL_DEBUG", "")] * 2
    assert not canary.exists(), "a payload ran"


def test_the_srun_options_are_split_and_requoted(tmp_path):
    values = dict(BASE_SWEEP, srun_args="--mpi=pmix --cpu-bind=cores")
    experiment = sweep.read_experiment(write_values(tmp_path, values, BASE_TRAIN))
    assert experiment.srun_args == ("--mpi=pmix", "--cpu-bind=cores")
    point = sweep.plan(experiment)[0]
    script = sweep.sbatch_script(experiment, point, Path("/opt/scalestudy"))
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
    path = write_values(tmp_path, BASE_SWEEP, dict(BASE_TRAIN, **{"warmup-steps": "-1"}))
    assert sweep.main([str(path), "--dry-run"]) == 0, "a negative number is a value"
