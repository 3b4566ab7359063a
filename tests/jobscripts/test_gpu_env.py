"""gpu_env.sh, which every GPU job script sources: the executables that travel packed in
the bundle are unpacked in place once per machine, and every rank runs with NVLink
multicast off."""
import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_env(cwd, out):
    script = (f'source "{ROOT}/jobscripts/gpu_env.sh" "{out}" && echo "$binary" && '
              'echo "$NCCL_NVLS_ENABLE" && echo "$LD_LIBRARY_PATH"')
    result = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "OUT"})
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


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
    pack(bundle, {"scalestudy": "#!/bin/sh\necho new\n", "scalestudy-base": "#!/bin/sh\necho old\n"})
    binary, nvls, library_path = source_env(tmp_path, tmp_path / "out")
    assert binary == str(bundle / "scalestudy")
    assert nvls == "0"
    assert library_path.split(":")[0] == str(bundle)
    assert (tmp_path / "out").is_dir()
    for name, text in {"scalestudy": "#!/bin/sh\necho new\n", "scalestudy-base": "#!/bin/sh\necho old\n"}.items():
        assert (bundle / name).read_text() == text
        assert os.access(bundle / name, os.X_OK)
    # The next job script of the same call finds them unpacked and leaves them as they are.
    (bundle / "scalestudy").write_text("rebuilt in place\n")
    source_env(tmp_path, tmp_path / "out")
    assert (bundle / "scalestudy").read_text() == "rebuilt in place\n"


def test_a_plain_bundle_is_used_as_it_is(tmp_path):
    bundle = tmp_path / ".gpu-bundle"
    bundle.mkdir()
    (bundle / "scalestudy").write_text("plain\n")
    binary, nvls, _ = source_env(tmp_path, tmp_path / "out")
    assert binary == str(bundle / "scalestudy")
    assert nvls == "0"
    assert (bundle / "scalestudy").read_text() == "plain\n"
    assert sorted(p.name for p in bundle.iterdir()) == ["scalestudy"]
