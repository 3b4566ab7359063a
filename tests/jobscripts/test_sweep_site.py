"""The sweep on a real site: environment modules loaded before every launch (under Lmod,
whose module files a test writes and whose environment the launch must see), pyxis and
Apptainer containers on the launch line, qos, reservation and memory in the sbatch
scripts, and every bad value of those keys refused with exit code 2 naming the key. The
scripts run here with stub launchers; no Slurm is started."""
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobscripts"))
import sweep  # noqa: E402
import sweep_experiment  # noqa: E402
import sweep_local  # noqa: E402
import sweep_plan  # noqa: E402
import sweep_slurm  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
needs_binary = pytest.mark.skipif(not BINARY, reason="needs SCALESTUDY_BINARY, the binary that checks each point")
# Debian's lmod package (install-deps.sh's SCALESTUDY_TEST_PACKAGES) puts its init here.
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")

TRAIN = ["model = tiny", "global-batch = 8", "batch-per-rank = 2"]
IMAGE = "nvcr.io#nvidia/pytorch:24.01-py3"
SIF = "/images/scalestudy.sif"
INSIDE = "/opt/scalestudy/bin/scalestudy"


def write_experiment(tmp_path, sweep_lines, train_lines=TRAIN):
    path = tmp_path / "experiment.ini"
    path.write_text("\n".join(["[sweep]", f"output_dir = {tmp_path}/out"] + sweep_lines + ["[train]"] + train_lines)
                    + "\n")
    return path


def experiment_of(tmp_path, sweep_lines):
    experiment = sweep_experiment.read_experiment(write_experiment(tmp_path, sweep_lines))
    return experiment, sweep_plan.plan(experiment)


def launch_words(script):
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return shlex.split(launch)


def make_stubs(bin_dir, names, body):
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\n" + body.replace("NAME", name))
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return bin_dir


# ---- modules ---------------------------------------------------------------------------

def test_modules_are_loaded_in_every_script_after_a_purge_and_before_the_exports_and_the_launch(tmp_path):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", "modules = cuda/12.4, gcc+cuda/12.1",
                                       "module_purge = yes"])
    path.write_text(path.read_text() + "[env]\nNCCL_DEBUG = INFO\n")
    experiment = sweep_experiment.read_experiment(path)
    assert experiment.modules == ("cuda/12.4", "gcc+cuda/12.1") and experiment.module_purge
    for point in sweep_plan.plan(experiment) + sweep_plan.bench_comm_points(experiment):
        script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
        lines = script.splitlines()
        loads = [line for line in lines if line.startswith("module ")]
        assert loads == ["module purge", "module load cuda/12.4", "module load gcc+cuda/12.1"], script
        assert lines.index("set -euo pipefail") < lines.index("module purge")
        assert lines.index(loads[-1]) < lines.index("export NCCL_DEBUG=INFO") < lines.index(
            next(line for line in lines if line.startswith("srun ")))
        # Where the job's shell has no `module`, the site's init script defines it.
        assert 'if ! type module >/dev/null 2>&1; then' in script and str(sweep_slurm.MODULE_INITS[0]) in script
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_without_modules_the_script_has_no_module_section(tmp_path):
    experiment, (point,) = experiment_of(tmp_path, ["scaling = weak"])
    script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    assert not re.search(r"^(module|set \+u|.*type module)", script, re.M), script
    experiment, (point,) = experiment_of(tmp_path, ["scaling = weak", "module_purge = yes"])
    assert [line for line in sweep_slurm.sbatch_script(experiment, point, Path("/x")).splitlines()
            if line.startswith("module ")] == ["module purge"]


# ---- containers --------------------------------------------------------------------------

def test_a_pyxis_image_goes_on_the_srun_line_with_its_mounts_workdir_and_the_binary_inside(tmp_path):
    experiment, points = experiment_of(tmp_path, [
        "scaling = weak", "gpus = 2", "backend = cuda", "gpus_per_node = 2", "gpu_bind = none",
        f"container_image = {IMAGE}", "container_mounts = /scratch:/scratch, /data:/data:ro+private",
        "container_workdir = /scratch/run"])
    out = tmp_path / "out"
    for point in points + sweep_plan.bench_comm_points(experiment):
        words = launch_words(sweep_slurm.sbatch_script(experiment, point, Path(INSIDE)))
        assert words[:8] == ["srun", "--mpi=pmix", "--gpu-bind=none", "--ntasks=2", f"--container-image={IMAGE}",
                             f"--container-mounts={out}:{out},/scratch:/scratch,/data:/data:ro+private",
                             "--container-workdir=/scratch/run", INSIDE]
        assert words[8] in ("train", "bench") and "apptainer" not in words


def test_an_apptainer_image_runs_every_rank_through_apptainer_exec(tmp_path):
    lines = ["scaling = weak", "gpus = 2", f"apptainer_image = {SIF}", "container_mounts = /scratch:/scratch:ro",
             "container_workdir = /scratch"]
    out = tmp_path / "out"
    for backend, nv in (("cuda", ["--nv"]), ("cpu", [])):
        experiment, (point,) = experiment_of(tmp_path, lines + [f"backend = {backend}", "gpus_per_node = 2"])
        ranks_run = ["apptainer", "exec"] + nv + ["--bind", f"{out}:{out},/scratch:/scratch:ro", "--pwd", "/scratch",
                                                   SIF, INSIDE, "train"]
        words = launch_words(sweep_slurm.sbatch_script(experiment, point, Path(INSIDE)))
        assert words[:3 + len(ranks_run)] == ["srun", "--mpi=pmix", "--ntasks=2"] + ranks_run
        assert not any(word.startswith("--container") for word in words)
        # A local sweep runs the same command under mpirun.
        command = sweep_local.local_command(experiment, point, Path(INSIDE), "mpirun")
        at = command.index("apptainer")
        assert command[at:at + len(ranks_run)] == ranks_run


def test_the_output_folder_is_mounted_unless_a_writable_mount_holds_it_at_its_own_path(tmp_path):
    out = tmp_path / "out"
    for mounts, expected in ((f"{tmp_path}:{tmp_path}", [f"{tmp_path}:{tmp_path}"]),
                             (f"{tmp_path}:{tmp_path}:ro", [f"{out}:{out}", f"{tmp_path}:{tmp_path}:ro"]),
                             (f"{tmp_path}:/data", [f"{out}:{out}", f"{tmp_path}:/data"]),
                             (f"{out}-other:{out}-other", [f"{out}:{out}", f"{out}-other:{out}-other"])):
        for image in (f"apptainer_image = {SIF}", f"container_image = {IMAGE}"):
            experiment, _ = experiment_of(tmp_path, ["scaling = weak", image, f"container_mounts = {mounts}"])
            assert sweep_plan.container_mounts_of(experiment) == expected, mounts


def test_the_shipped_site_experiments_name_their_modules_and_their_container():
    modules = sweep_experiment.read_experiment(ROOT / "experiments" / "gpt2-small-modules-site.ini")
    assert modules.modules[:2] == ("gcc/12.3.0", "cuda/12.4.1") and modules.module_purge
    assert modules.qos == "normal" and modules.mem == "0" and not modules.containerised()
    pyxis = sweep_experiment.read_experiment(ROOT / "experiments" / "gpt2-small-pyxis-site.ini")
    assert pyxis.container_binary == INSIDE and pyxis.reservation == "scaling-study" and not pyxis.modules
    (point,) = [point for point in sweep_plan.plan(pyxis) if point.ranks == 16 and point.strategy == "ddp"]
    words = launch_words(sweep_slurm.sbatch_script(pyxis, point, Path(INSIDE)))
    assert words[3:7] == ["--container-image=registry.example.org#my-project/scalestudy:0.9-cuda12.4",
                          "--container-mounts=/lustre/my-project:/lustre/my-project",
                          "--container-workdir=/lustre/my-project", INSIDE]


def test_qos_reservation_and_memory_reach_the_point_scripts_and_the_report_script(tmp_path):
    experiment, (point,) = experiment_of(tmp_path, ["scaling = weak", "qos = high", "reservation = maint,gpu-res",
                                                    "mem = 480G", "partition = gpu", "account = lab"])
    script = sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy"))
    sbatch = re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M)
    for option in (("qos", "high"), ("reservation", "maint,gpu-res"), ("mem", "480G"), ("partition", "gpu"),
                   ("account", "lab")):
        assert option in sbatch, script
    report = re.findall(r"^#SBATCH --([\w-]+)=(.*)$", sweep_slurm.report_script(experiment), re.M)
    assert ("qos", "high") in report and ("reservation", "maint,gpu-res") in report
    assert "mem" not in dict(report)
    experiment, (point,) = experiment_of(tmp_path, ["scaling = weak"])
    assert not re.search(r"--(qos|reservation|mem)=", sweep_slurm.sbatch_script(experiment, point, Path("/x")))


@pytest.mark.parametrize("lines, fragment", [
    (["modules = -f"], "modules = '-f'"),
    (["modules = cuda;id"], "modules = 'cuda;id'"),
    (["modules = $(id)"], "modules = '$(id)'"),
    (["modules = cuda/12.4, `id`"], "modules = '`id`'"),
    (["modules = 'cuda'"], "modules = \"'cuda'\""),
    (["modules = cuda%12"], "modules = 'cuda%12'"),
    (["module_purge = sometimes"], "module_purge = 'sometimes'"),
    (["module-purge = yes"], "(the [sweep] keys are written with _: module_purge)"),
    (["qos = high priority"], "qos = 'high priority'"),
    (["qos = $(id)"], "qos = '$(id)'"),
    (["reservation = r;id"], "reservation = 'r;id'"),
    (["mem = lots"], "mem = 'lots'"),
    (["mem = 64GB"], "mem = '64GB'"),
    ([f"container_image = {IMAGE}", f"apptainer_image = {SIF}"], "container_image and apptainer_image"),
    (["container_image = -v"], "container_image = '-v'"),
    (["container_image = img;id"], "container_image = 'img;id'"),
    (["container_image = $(id)"], "container_image = '$(id)'"),
    (["apptainer_image = images/x.sif"], "apptainer_image = 'images/x.sif'"),
    (["apptainer_image = docker://x`id`"], "apptainer_image = 'docker://x`id`'"),
    ([f"container_image = {IMAGE}", "container_mounts = scratch:/scratch"], "container_mounts = 'scratch:/scratch'"),
    ([f"container_image = {IMAGE}", "container_mounts = /scratch"], "container_mounts = '/scratch'"),
    ([f"container_image = {IMAGE}", "container_mounts = /a:/b:c:d"], "container_mounts = '/a:/b:c:d'"),
    ([f"container_image = {IMAGE}", "container_mounts = /a:/b:ro;id"], "container_mounts = '/a:/b:ro;id'"),
    ([f"container_image = {IMAGE}", "container_mounts = /a:$(id)"], "container_mounts = '/a:$(id)'"),
    ([f"apptainer_image = {SIF}", "container_mounts = /a:/b:ro+private"], "Apptainer's bind options"),
    ([f"container_image = {IMAGE}", "container_workdir = work"], "container_workdir = 'work'"),
    ([f"container_image = {IMAGE}", "container_binary = bin/scalestudy"], "container_binary = 'bin/scalestudy'"),
    ([f"apptainer_image = {SIF}", "container_binary = /opt/$(id)"], "container_binary = '/opt/$(id)'"),
    (["container_mounts = /a:/a"], "container_mounts needs a container"),
    (["container_binary = /opt/x"], "container_binary needs a container"),
])
def test_a_bad_site_value_exits_2_naming_the_key(tmp_path, capsys, lines, fragment):
    path = write_experiment(tmp_path, ["scaling = weak"] + lines)
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", "/opt/none"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_in_a_container_the_binary_need_not_be_here_but_its_path_is_absolute(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 1, 2", f"container_image = {IMAGE}"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", "/nowhere/scalestudy"]) == 0
    out = capsys.readouterr().out
    assert "not checked before they run" in out and "/nowhere/scalestudy" in out
    script = (tmp_path / "out" / "jobs" / "weak-ddp-overlap_off-n2-r0.sbatch").read_text()
    assert launch_words(script)[5] == "/nowhere/scalestudy"
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", "nowhere/scalestudy"]) == 2
    assert "--binary nowhere/scalestudy: a relative path" in capsys.readouterr().err
    # container_binary names the binary inside the image, whatever --binary says.
    path.write_text(path.read_text().replace("[train]", f"container_binary = {INSIDE}\n[train]"))
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", "nowhere/scalestudy"]) == 0
    script = (tmp_path / "out" / "jobs" / "weak-ddp-overlap_off-n2-r0.sbatch").read_text()
    assert launch_words(script)[5] == INSIDE


@needs_binary
def test_in_a_container_a_binary_here_still_checks_every_point(tmp_path, capsys):
    path = write_experiment(tmp_path, ["scaling = strong", "gpus = 1, 2", f"apptainer_image = {SIF}",
                                       f"container_binary = {INSIDE}"], ["model = tiny", "global-batch = 7"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY]) == 2
    assert "point strong-ddp-overlap_off-n2-r0 (2 rank(s)) would not start" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_local_sweep_refuses_a_pyxis_image_and_runs_an_apptainer_one_under_mpirun(tmp_path, monkeypatch, capsys):
    calls = tmp_path / "calls"
    calls.mkdir()
    bin_dir = make_stubs(tmp_path / "bin", ["mpirun"], 'printf "%s\\n" "$@" > "$STUB_CALLS/NAME.$$"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_CALLS", str(calls))
    pyxis = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", "bench_comm = off", f"container_image = {IMAGE}"])
    assert sweep.main([str(pyxis), "--binary", "/nowhere/scalestudy", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert f"container_image = {IMAGE}: a pyxis container runs through srun, with --launcher slurm" in err
    assert sweep.main([str(pyxis), "--binary", "/nowhere/scalestudy", "--dry-run"]) == 0, "a dry run shows the plan"
    assert f"--container-image={IMAGE}" in capsys.readouterr().out
    apptainer = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", "bench_comm = off",
                                            f"apptainer_image = {SIF}", f"container_binary = {INSIDE}"])
    assert sweep.main([str(apptainer), "--binary", "/nowhere/scalestudy", "--no-report"]) == 2
    assert "apptainer is not on PATH here" in capsys.readouterr().err
    make_stubs(bin_dir, ["apptainer"], "exit 1\n")
    assert sweep.main([str(apptainer), "--binary", "/nowhere/scalestudy", "--no-report"]) == 1, "stubs run no point"
    (call,) = [path.read_text().splitlines() for path in calls.glob("mpirun.*")]
    at = call.index("apptainer")
    assert call[at:at + 8] == ["apptainer", "exec", "--bind", f"{tmp_path}/out:{tmp_path}/out", SIF, INSIDE, "train",
                               "--experiment"]


def test_the_help_lists_every_sweep_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--help"])
    text = capsys.readouterr().out
    keys = text.split("[sweep] keys of an experiment file, with their defaults")[1]
    for key in ("modules", "module_purge", "container_image", "apptainer_image", "container_mounts",
                "container_workdir", "container_binary", "qos", "reservation", "mem", "partition", "gpus"):
        assert re.search(rf"^  {key} +default: \S", keys, re.M), key
    assert len(re.findall(r"^  \w+ +default: ", keys, re.M)) == len(sweep_experiment.SWEEP_KEYS)


# ---- Lmod: the generated script loads a module, and the launch sees its environment -------

def lmod_site(tmp_path):
    """A module tree holding probe/1.0, a Tcl module file (read by Lmod and Environment
    Modules alike) that sets SCALESTUDY_PROBE and puts a folder of stub launchers first on
    PATH: srun and mpirun, each writing the environment it was started with."""
    assert LMOD_INIT.is_file(), (f"Lmod is not installed ({LMOD_INIT} is missing): install Debian's lmod package "
                                 "(jobscripts/install-deps.sh lists it among SCALESTUDY_TEST_PACKAGES)")
    launchers = make_stubs(tmp_path / "site-bin", ["srun", "mpirun"],
                           'env > "$STUB_CALLS/NAME-env.$$"\nprintf "%s\\n" "$@" > "$STUB_CALLS/NAME.$$"\n')
    modules = tmp_path / "modulefiles"
    (modules / "probe").mkdir(parents=True)
    (modules / "probe" / "1.0").write_text("#%Module1.0\nsetenv SCALESTUDY_PROBE from-the-module\n"
                                           f"prepend-path PATH {launchers}\n")
    calls = tmp_path / "calls"
    calls.mkdir()
    return modules, calls


def bare_environment(tmp_path, modules, calls):
    """A job's environment on a node where nothing defined `module`: no exported shell
    function, no BASH_ENV, no MODULESHOME; the site's module tree on MODULEPATH."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "MODULEPATH": str(modules),
            "STUB_CALLS": str(calls)}


def seen_by(calls, name):
    return [dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
            for path in sorted(calls.glob(f"{name}-env.*"))]


def lmod_script(tmp_path, sweep_lines):
    experiment, (point,) = experiment_of(tmp_path, ["scaling = weak", "gpus = 2"] + sweep_lines)
    script = tmp_path / "point.sbatch"
    script.write_text(sweep_slurm.sbatch_script(experiment, point, Path("/opt/scalestudy")))
    return script


def test_under_lmod_the_launch_of_a_generated_script_sees_the_modules_environment(tmp_path):
    modules, calls = lmod_site(tmp_path)
    script = lmod_script(tmp_path, ["modules = probe/1.0", "module_purge = yes"])
    env = bare_environment(tmp_path, modules, calls)
    # A shell that was not given `module` finds Lmod's init script and loads the module.
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    (seen,) = seen_by(calls, "srun")
    assert seen["SCALESTUDY_PROBE"] == "from-the-module" and "LOADEDMODULES" in seen, seen
    assert seen["LOADEDMODULES"] == "probe/1.0"
    # A shell handed `module` by the submitting shell (Lmod exports it) uses that one.
    for stale in calls.iterdir():
        stale.unlink()
    handed = subprocess.run(["bash", "-c", f'. {LMOD_INIT} && bash {shlex.quote(str(script))}'], env=env,
                            capture_output=True, text=True, timeout=60)
    assert handed.returncode == 0, handed.stderr
    (seen,) = seen_by(calls, "srun")
    assert seen["SCALESTUDY_PROBE"] == "from-the-module"


def test_under_lmod_a_module_that_does_not_load_ends_the_job_before_the_launch(tmp_path):
    modules, calls = lmod_site(tmp_path)
    script = lmod_script(tmp_path, ["modules = probe/1.0, nosuch/2.0"])
    run = subprocess.run(["bash", str(script)], env=bare_environment(tmp_path, modules, calls), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0 and "nosuch/2.0" in run.stderr, run.stderr
    assert not list(calls.iterdir()), "nothing was launched"


def lmod_sweep_environment(monkeypatch, tmp_path, modules, calls):
    """This process's environment as a login shell without Lmod's function would have it."""
    for name in list(os.environ):
        if name.startswith("BASH_FUNC_") or name in ("BASH_ENV", "MODULESHOME", "LOADEDMODULES", "_LMFILES_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MODULEPATH", str(modules))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("STUB_CALLS", str(calls))


def test_under_lmod_a_module_the_sweep_cannot_load_exits_2_naming_it(tmp_path, monkeypatch, capsys):
    modules, calls = lmod_site(tmp_path)
    lmod_sweep_environment(monkeypatch, tmp_path, modules, calls)
    path = write_experiment(tmp_path, ["scaling = weak", "modules = probe/1.0, nosuch/2.0"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", "/opt/none"]) == 2
    err = capsys.readouterr().err
    assert "modules = probe/1.0, nosuch/2.0: loading them here failed" in err and "nosuch/2.0" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


@needs_binary
def test_under_lmod_a_local_sweep_launches_and_checks_in_the_modules_environment(tmp_path, monkeypatch):
    modules, calls = lmod_site(tmp_path)
    lmod_sweep_environment(monkeypatch, tmp_path, modules, calls)
    path = write_experiment(tmp_path, ["scaling = weak", "gpus = 2", "bench_comm = off", "modules = probe/1.0"])
    # mpirun is the module's: the stub on the PATH it sets, not the one this host has.
    assert sweep.main([str(path), "--binary", BINARY, "--mpirun", "mpirun", "--no-report"]) == 1, \
        "the stub mpirun runs no point"
    (seen,) = seen_by(calls, "mpirun")
    assert seen["SCALESTUDY_PROBE"] == "from-the-module" and seen["LOADEDMODULES"] == "probe/1.0"


@needs_binary
def test_a_host_without_module_writes_the_scripts_but_runs_nothing_locally(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep_slurm, "MODULE_INITS", (str(tmp_path / "no-init"),))
    for name in list(os.environ):
        if name.startswith("BASH_FUNC_") or name in ("BASH_ENV", "MODULESHOME"):
            monkeypatch.delenv(name)
    path = write_experiment(tmp_path, ["scaling = weak", "modules = cuda/12.4"])
    assert sweep.main([str(path), "--launcher", "slurm", "--binary", BINARY]) == 0
    assert "modules = cuda/12.4: this host has no module command" in capsys.readouterr().out
    assert "module load cuda/12.4" in (tmp_path / "out" / "jobs" / "weak-ddp-overlap_off-n1-r0.sbatch").read_text()
    assert sweep.main([str(path), "--binary", BINARY, "--no-report"]) == 2
    assert "a local sweep loads the modules here" in capsys.readouterr().err
