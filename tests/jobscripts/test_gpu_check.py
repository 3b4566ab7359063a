"""jobscripts/gpu_check.sh, with stand-ins for nvidia-smi, cmake, ctest and mpirun: it
builds with the cuda preset, runs the GPU tests through ctest, trains on one GPU and, on a
node of two, on two with each strategy, writes into the output folder it is given, and
fails when a step fails."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUBS = {
    # nvidia-smi -L lists $GPUS GPUs; anything else prints a line.
    "nvidia-smi": """#!/bin/sh
if [ "$1" = -L ]; then i=0; while [ $i -lt "$GPUS" ]; do echo "GPU $i: NVIDIA Test (UUID: GPU-$i)"; i=$((i+1)); done
else echo "nvidia-smi $*"; fi
""",
    # cmake --build makes a scalestudy that writes its --output file and a summary line.
    "cmake": """#!/bin/sh
echo "cmake $*" >> "$CALLS"
if [ "$1" = --build ]; then
  mkdir -p build/cuda
  cat > build/cuda/scalestudy <<'BINARY'
#!/bin/sh
if [ "$1" = --version ]; then echo "scalestudy 0.1.0 (git test)"; exit 0; fi
while [ $# -gt 0 ]; do [ "$1" = --output ] && touch "$2"; shift; done
echo "  median step 50.00 ms"
BINARY
  chmod +x build/cuda/scalestudy
fi
""",
    "ctest": """#!/bin/sh
echo "ctest $*" >> "$CALLS"
echo "100% tests passed, 0 tests failed out of 8"
exit "${CTEST_STATUS:-0}"
""",
    # mpirun logs its arguments and the environment's NCCL_NVLS_ENABLE, then runs the
    # command that follows its options.
    "mpirun": """#!/bin/sh
echo "mpirun NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE $*" >> "$CALLS"
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-x|--bind-to) shift 2 ;;
    -*) shift ;;
    *) exec "$@" ;;
  esac
done
""",
}


def run_check(tmp_path, gpus, *args, ctest_status=0, nccl_env=None):
    repo = tmp_path / "repo"
    (repo / "jobscripts").mkdir(parents=True)
    shutil.copy(ROOT / "jobscripts" / "gpu_check.sh", repo / "jobscripts" / "gpu_check.sh")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls.log"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", GPUS=str(gpus), CALLS=str(calls),
               CTEST_STATUS=str(ctest_status))
    env = {key: value for key, value in env.items() if not key.startswith("NCCL_")}
    env.update(nccl_env or {})
    cwd = tmp_path / "work"
    cwd.mkdir()
    result = subprocess.run(["bash", str(repo / "jobscripts" / "gpu_check.sh"), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=60)
    return result, calls.read_text().splitlines(), cwd


def test_two_gpus_build_test_and_train_with_each_strategy(tmp_path):
    result, calls, cwd = run_check(tmp_path, 2, "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls[0] == "cmake --preset cuda"
    assert calls[1].startswith("cmake --build --preset cuda")
    assert calls[2].startswith("ctest --preset cuda -L gpu")
    trains = calls[3:]
    assert len(trains) == 3
    # NCCL's defaults: nothing is set or forwarded that the caller did not set.
    assert all("NCCL_NVLS_ENABLE= " in line and "-x" not in line for line in trains)
    assert "-np 1" in trains[0]
    assert "-np 2" in trains[1] and "--strategy ddp --overlap on" in trains[1]
    assert "-np 2" in trains[2] and "--strategy zero2 --overlap on" in trains[2]
    out = cwd / "out"
    assert {p.name for p in out.glob("*.h5")} == {"gpt2-small-1gpu.h5", "gpt2-small-2gpu-ddp.h5",
                                                  "gpt2-small-2gpu-zero2.h5"}
    assert (out / "build.log").exists() and (out / "gpu-tests.log").exists()
    assert "every check passed" in result.stdout


def test_one_gpu_trains_once_into_the_default_folder(tmp_path):
    result, calls, cwd = run_check(tmp_path, 1)
    assert result.returncode == 0, result.stdout + result.stderr
    trains = [line for line in calls if line.startswith("mpirun")]
    assert len(trains) == 1 and "-np 1" in trains[0]
    assert (cwd / "gpu-check" / "gpt2-small-1gpu.h5").exists()


def test_a_failing_gpu_test_fails_the_check_and_is_named(tmp_path):
    result, calls, _ = run_check(tmp_path, 1, "out", ctest_status=8)
    assert result.returncode == 1
    assert "failed: GPU tests" in result.stderr
    # The training still runs, so one check reports everything that is wrong.
    assert any(line.startswith("mpirun") for line in calls)


def test_the_callers_nccl_settings_reach_every_rank(tmp_path):
    result, calls, _ = run_check(tmp_path, 2, "out", nccl_env={"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "WARN"})
    assert result.returncode == 0, result.stdout + result.stderr
    trains = calls[3:]
    assert len(trains) == 3
    assert all("NCCL_NVLS_ENABLE=0" in line and "-x NCCL_NVLS_ENABLE" in line and "-x NCCL_DEBUG" in line
               for line in trains)
