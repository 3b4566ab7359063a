"""Series never pool what differs: device, topology, backend, precision, build (commit
and dirty flag) and, on the CPU backend, CPU model and logical cores; the report lists
what differs."""
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.cli import main
from scalestudy_analysis.load import load_results
from scalestudy_analysis.metrics import group_series
from synth import base_config, write_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2-small-strong-4xh200"
H100 = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"


def series_of(root):
    runs, _, _ = load_results(root)
    return group_series(runs)


def copy_as_h100(source, target):
    """The example's ddp files, the copy's /ranks/device and hostnames rewritten as if it
    had run on an H100 node."""
    shutil.copytree(source, target)
    for path in Path(target).rglob("*.h5"):
        with h5py.File(path, "r+") as handle:
            world_size = handle["ranks/device"].shape[0]
            for name, value in (("device", H100), ("hostname", "h100-node")):
                del handle[f"ranks/{name}"]
                handle.create_dataset(f"ranks/{name}", data=np.array([value] * world_size, dtype=object),
                                      dtype=h5py.string_dtype())


@pytest.fixture(scope="module")
def h100_and_h200(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(EXAMPLE / "strong" / "ddp-overlap_on", root / "h200" / "ddp")
    copy_as_h100(EXAMPLE / "strong" / "ddp-overlap_on", root / "h100" / "ddp")
    return root


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason=f"{EXAMPLE} is missing")
def test_an_h100_and_an_h200_set_are_two_series_and_the_report_names_the_device(h100_and_h200, tmp_path):
    series_list, problems = series_of(h100_and_h200)
    assert len(series_list) == 2
    devices = sorted(run.devices[0] for s in series_list for run in s.runs[:1])
    assert devices[0] == H100 and devices[1].startswith("NVIDIA H200")
    for series in series_list:
        assert len({run.devices[0] for run in series.runs}) == 1
        assert len(series.runs) == 9
    assert [p.kind for p in problems] == ["mixed device"]
    assert "device=" + H100 in problems[0].message
    assert main([str(h100_and_h200), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    apart = report.split("## What sets the series apart", 1)[1].split("\n## ", 1)[0]
    assert "**Differs between series:** device." in apart
    assert H100 in apart
    assert "**mixed device**" in report.split("## Problems", 1)[1]


@pytest.mark.parametrize("change, kind", [
    (dict(devices=["NVIDIA H100"] * 2), "mixed device"),
    (dict(git_sha="abc1234", git_dirty=1), "mixed git_sha"),
    (dict(git_sha="abc1234-dirty"), "mixed git_sha"),
    (dict(backend="cuda"), "mixed device"),
    (dict(cpu_model="Other CPU"), "mixed cpu_model"),
    (dict(logical_cores=4), "mixed logical_cores"),
])
def test_each_difference_makes_a_series_of_its_own(tmp_path, change, kind):
    for n in (1, 2):
        write_run(tmp_path / f"a{n}.h5", world_size=n, git_sha="abc1234", git_dirty=0,
                  devices=["NVIDIA H200"] * n if "devices" in change else None)
    changed = dict(change)
    if "devices" in changed:
        changed["devices"] = ["NVIDIA H100"] * 2
    write_run(tmp_path / "b2.h5", world_size=2, config=base_config(repeat=1),
              **{"git_sha": "abc1234", **changed})
    series_list, problems = series_of(tmp_path)
    assert sorted(len(s.runs) for s in series_list) == [1, 2]
    assert [p.kind for p in problems] == [kind]


def test_overlap_after_resolved_per_world_size_keeps_one_series_and_a_requested_one_splits(tmp_path):
    # --overlap-after auto bounds zero2's share by 1/N: what ran differs along the series.
    for n, resolved in ((1, 0.5), (2, 0.5), (4, 0.25)):
        config = base_config(strategy="zero2", overlap="on", overlap_after="auto",
                             overlap_after_resolved=resolved)
        write_run(tmp_path / "auto" / f"n{n}.h5", world_size=n, config=config)
    series_list, problems = series_of(tmp_path / "auto")
    assert [len(s.runs) for s in series_list] == [3] and problems == []
    # Another requested share is another configuration.
    write_run(tmp_path / "auto" / "n4-explicit.h5", world_size=4,
              config=base_config(strategy="zero2", overlap="on", overlap_after="0.1",
                                 overlap_after_resolved=0.1, repeat=1))
    series_list, problems = series_of(tmp_path / "auto")
    assert sorted(len(s.runs) for s in series_list) == [1, 3]
    assert [p.kind for p in problems] == ["mixed config"]


def test_a_dirty_flag_and_a_dirty_suffix_are_the_same_build(tmp_path):
    # GPU runs, so that the version 4 file's unknown CPU does not split them.
    write_run(tmp_path / "a.h5", world_size=1, git_sha="abc1234", git_dirty=1, backend="cuda")
    write_run(tmp_path / "b.h5", world_size=2, git_sha="abc1234-dirty", schema_version=4,
              backend="cuda")
    series_list, problems = series_of(tmp_path)
    assert len(series_list) == 1 and problems == []


def test_cpu_model_and_cores_do_not_split_gpu_runs(tmp_path):
    write_run(tmp_path / "a.h5", world_size=1, backend="cuda", cpu_model="one")
    write_run(tmp_path / "b.h5", world_size=2, backend="cuda", cpu_model="two", logical_cores=8)
    series_list, problems = series_of(tmp_path)
    assert len(series_list) == 1 and problems == []


def test_the_same_n_on_other_nodes_is_another_series_and_one_node_runs_join_both(tmp_path):
    # 8 ranks as 2 nodes × 4 and as 4 nodes × 2; the 1- and 2-rank runs on one node fit
    # both packings, and the 4-rank run on one node fits only the one of 4 per node.
    write_run(tmp_path / "n1.h5", world_size=1)
    write_run(tmp_path / "n2.h5", world_size=2)
    write_run(tmp_path / "n4.h5", world_size=4)
    write_run(tmp_path / "n8x4.h5", world_size=8, hostnames=[f"a{r // 4}" for r in range(8)])
    write_run(tmp_path / "n8x2.h5", world_size=8, config=base_config(repeat=1),
              hostnames=[f"b{r // 2}" for r in range(8)])
    series_list, problems = series_of(tmp_path)
    sizes = {s.variant["ranks per node"]: sorted(r.world_size for r in s.runs) for s in series_list}
    assert sizes == {"2": [1, 2, 8], "4": [1, 2, 4, 8]}
    assert [p.kind for p in problems] == ["mixed ranks per node"]


def test_a_version_4_file_reads_its_host_as_unknown_and_a_version_5_file_without_it_is_named(tmp_path):
    old = write_run(tmp_path / "v4.h5", world_size=1, schema_version=4)
    new = write_run(tmp_path / "v5.h5", world_size=1, config=base_config(repeat=1))
    with h5py.File(new, "r+") as handle:
        del handle["ranks/logical_cores"]
    runs, _, problems = load_results(tmp_path)
    by_name = {Path(run.path).name: run for run in runs}
    assert by_name["v4.h5"].logical_cores is None and by_name["v4.h5"].cpu_binding is None
    assert by_name["v5.h5"].logical_cores is None and by_name["v5.h5"].cpu_binding == ["0"]
    assert [(Path(p.where).name, p.kind, p.excluded) for p in problems] == \
        [("v5.h5", "missing field", False)]
    assert "/ranks/logical_cores" in problems[0].message
    assert str(old) != str(new)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason=f"{EXAMPLE} is missing")
def test_compare_puts_the_h100_set_beside_the_h200_set_with_intervals(h100_and_h200, tmp_path):
    out = tmp_path / "compare"
    assert main(["compare", str(h100_and_h200 / "h200"), str(h100_and_h200 / "h100"), "-o", str(out)]) == 0
    rows = pd.read_csv(out / "compare.csv")
    assert rows["N"].tolist() == [1, 2, 4]
    # The copies hold the same steps, so every ratio is 1 and its interval is about it.
    np.testing.assert_allclose(rows["throughput_ratio"], 1.0, rtol=1e-12)
    assert ((rows["throughput_ratio_low"] < 1) & (rows["throughput_ratio_high"] > 1)).all()
    assert rows["differs"].str.contains("device: NVIDIA H200").all()
    assert H100 in (out / "compare.md").read_text()
