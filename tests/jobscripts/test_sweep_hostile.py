"""Hostile experiment files: every field of [sweep], [train] and [env] carrying shell
syntax or a continuation line. Each must be refused with exit code 2, or give scripts in which nothing
but the intended commands run: the scripts are run here with a stub srun, and a canary
file that every payload tries to create must not appear."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import sweep  # noqa: E402

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


def write(tmp_path, sweep_values, train_values, env_values=None):
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
    path = write(tmp_path, sweep_values, train_values, env_values)
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
    experiment = sweep.read_experiment(write(tmp_path, values, BASE_TRAIN))
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
    path = write(tmp_path, dict(BASE_SWEEP, **{key: value}), BASE_TRAIN)
    assert sweep.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert key in err and message in err


def test_a_train_value_that_looks_like_an_option_is_refused(tmp_path, capsys):
    path = write(tmp_path, BASE_SWEEP, dict(BASE_TRAIN, steps="--output=/etc/passwd"))
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "[train] steps" in capsys.readouterr().err
    path = write(tmp_path, BASE_SWEEP, dict(BASE_TRAIN, **{"warmup-steps": "-1"}))
    assert sweep.main([str(path), "--dry-run"]) == 0, "a negative number is a value"
