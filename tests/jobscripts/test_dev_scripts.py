"""The developer scripts' common parts: dev/gpu.sh's command line, dev/gpu_env.sh, which it
sources (the output folder is its argument, the executables packed in the bundle are
unpacked in place once, every rank runs with NVLink multicast off), and
dev/make_bundle.sh, which packs a build with the libraries it loads."""
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def source_env(cwd, *args, env_extra=None):
    script = (f'source "{ROOT}/dev/gpu_env.sh" "$@" && echo "$out" && echo "$binary" && '
              'echo "$NCCL_NVLS_ENABLE" && echo "$LD_LIBRARY_PATH" && echo "$mpirun"')
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "BUNDLE")}
    env.update(env_extra or {})
    return subprocess.run(["bash", "-c", script, "gpu_env.sh", *args], cwd=cwd, capture_output=True,
                          text=True, env=env)


def sourced(cwd, *args, env_extra=None):
    result = source_env(cwd, *args, env_extra=env_extra)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("args", [[], ["ab"], ["bogus", "out"]])
def test_gpu_script_refuses_a_missing_or_unknown_command(tmp_path, args):
    result = subprocess.run(["bash", str(ROOT / "dev" / "gpu.sh"), *args], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage:" in result.stderr and "ab|per-device|state|profile|bench" in result.stderr
    assert not (tmp_path / "out").exists()


def pack(bundle, files):
    with tarfile.open(bundle / "executables.tar.xz", "w:xz") as archive:
        for name, text in files.items():
            path = bundle.parent / name
            path.write_text(text)
            path.chmod(0o755)
            archive.add(path, arcname=name)
            path.unlink()


def test_packed_executables_are_unpacked_once_in_place(tmp_path):
    bundle = tmp_path / ".gpu-bundle"
    bundle.mkdir()
    files = {"scalestudy": "#!/bin/sh\necho new\n", "scalestudy-base": "#!/bin/sh\necho old\n"}
    pack(bundle, files)
    out, binary, nvls, library_path, mpirun = sourced(tmp_path, "results/ab")
    assert out == "results/ab" and (tmp_path / "results" / "ab").is_dir()
    assert binary == str(bundle / "scalestudy")
    assert nvls == "0" and "-x NCCL_NVLS_ENABLE" in mpirun
    assert library_path.split(":")[0] == str(bundle)
    for name, text in files.items():
        assert (bundle / name).read_text() == text
        assert os.access(bundle / name, os.X_OK)
    # The next script on the same node finds them unpacked and leaves them as they are.
    (bundle / "scalestudy").write_text("rebuilt in place\n")
    sourced(tmp_path, "results/ab")
    assert (bundle / "scalestudy").read_text() == "rebuilt in place\n"


def test_a_plain_bundle_elsewhere_is_used_as_it_is(tmp_path):
    bundle = tmp_path / "elsewhere"
    bundle.mkdir()
    (bundle / "scalestudy").write_text("plain\n")
    _, binary, nvls, library_path, _ = sourced(tmp_path, "out", env_extra={"BUNDLE": str(bundle)})
    assert binary == str(bundle / "scalestudy")
    assert nvls == "0" and library_path.split(":")[0] == str(bundle)
    assert sorted(p.name for p in bundle.iterdir()) == ["scalestudy"]


def fake_python(folder, script):
    folder.mkdir()
    python = folder / "python3"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_pytorchs_cudnn_goes_last_on_the_library_path_where_python_has_it(tmp_path):
    (tmp_path / ".gpu-bundle").mkdir()
    cudnn = tmp_path / "site" / "nvidia" / "cudnn"
    (cudnn / "lib").mkdir(parents=True)
    found = fake_python(tmp_path / "bin", f"echo {cudnn}\n")
    library_path = sourced(tmp_path, "out", env_extra=found)[3].split(":")
    assert library_path[0] == str(tmp_path / ".gpu-bundle") and library_path[-1] == str(cudnn / "lib")
    # Without the package (python3 fails), nothing is added.
    missing = fake_python(tmp_path / "bin-none", "exit 1\n")
    assert str(cudnn / "lib") not in sourced(tmp_path, "out", env_extra=missing)[3]


def test_without_an_output_folder_or_a_bundle_it_stops_with_usage(tmp_path):
    (tmp_path / ".gpu-bundle").mkdir()
    result = source_env(tmp_path, env_extra={"OUT": str(tmp_path / "ignored")})
    assert result.returncode == 2 and "OUTPUT_DIR" in result.stderr
    assert not (tmp_path / "ignored").exists()
    (tmp_path / ".gpu-bundle").rmdir()
    result = source_env(tmp_path, "out")
    assert result.returncode == 2 and "bundle" in result.stderr


@pytest.mark.skipif(not shutil.which("h5dump") or not shutil.which("ldd"), reason="needs h5dump and ldd")
def test_the_bundle_holds_the_executables_and_the_hdf5_libraries_they_load(tmp_path):
    # h5dump links the same HDF5 as the scalestudy binary: it stands in for the binary.
    build = tmp_path / "build"
    (build / "tests").mkdir(parents=True)
    shutil.copy(shutil.which("h5dump"), build / "scalestudy")
    gpu_tests = sorted(p.stem for p in (ROOT / "tests" / "gpu").glob("*test_*.cpp"))
    assert gpu_tests
    for name in gpu_tests[:2]:
        shutil.copy(shutil.which("h5dump"), build / "tests" / name)
    (build / "tests" / "test_not_a_gpu_test").write_text("")
    bundle = tmp_path / "bundle"
    subprocess.run(["bash", str(ROOT / "dev" / "make_bundle.sh"), str(build), str(bundle)], check=True,
                   capture_output=True, text=True)
    names = {p.name for p in bundle.iterdir()}
    assert {"scalestudy", *gpu_tests[:2]} <= names
    assert "test_not_a_gpu_test" not in names
    hdf5 = [name for name in names if name.startswith("libhdf5")]
    assert hdf5, names
    assert all(not (bundle / name).is_symlink() for name in hdf5)

    packed = tmp_path / "packed"
    subprocess.run(["bash", str(ROOT / "dev" / "make_bundle.sh"), str(build), str(packed)], check=True,
                   capture_output=True, text=True, env=dict(os.environ, PACK="1"))
    with tarfile.open(packed / "executables.tar.xz") as archive:
        assert {"scalestudy", *gpu_tests[:2]} == set(archive.getnames())
    assert not (packed / "scalestudy").exists() and any(p.name.startswith("libhdf5") for p in packed.iterdir())
