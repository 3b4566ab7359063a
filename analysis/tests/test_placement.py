"""Where each rank ran (/ranks, versions 5, 7 and 8): nodes and local ranks, each rank's
GPU, the problems when MPI's nodes and the hostnames disagree or ranks share a GPU, the
report's nodes × ranks per node, its links (emulated or not, NCCL's transports) and its
intra- and inter-node communication."""
import re

import h5py
import pandas as pd

from scalestudy_analysis.results import machine
from scalestudy_analysis.report.cli import main
from scalestudy_analysis.results.load import load_results, read_run
from scalestudy_analysis.results.metrics import group_series
from synth import base_config, write_run

FOUR_ON_TWO_HOSTS = ["node-a", "node-a", "node-b", "node-b"]


def rewrite(path, name, values):
    with h5py.File(path, "r+") as handle:
        handle[f"ranks/{name}"][...] = values


def test_a_version_7_file_holds_each_ranks_node_local_rank_and_gpu(tmp_path):
    run = read_run(write_run(tmp_path / "run.h5", world_size=4, backend="cuda",
                             hostnames=FOUR_ON_TWO_HOSTS))
    assert run.problems == []
    assert run.node_index.tolist() == [0, 0, 1, 1] and run.local_rank.tolist() == [0, 1, 0, 1]
    assert len(set(run.device_uuid)) == 4 and all(u.startswith("GPU-") for u in run.device_uuid)
    assert run.device_pci_bus_id == ["00000000:18:00.0", "00000000:19:00.0"] * 2


def test_older_files_read_without_what_they_lack_and_a_version_7_file_without_it_is_named(tmp_path):
    v4 = read_run(write_run(tmp_path / "v4.h5", world_size=2, schema_version=4))
    v5 = read_run(write_run(tmp_path / "v5.h5", world_size=2, schema_version=5))
    assert v4.problems == [] and v4.node_index is None and v4.device_uuid is None
    v6 = read_run(write_run(tmp_path / "v6.h5", world_size=2, schema_version=6))
    for older in (v5, v6):
        assert older.problems == [] and older.local_rank.tolist() == [0, 1] and older.device_uuid is None
    path = write_run(tmp_path / "v7.h5", world_size=2)
    with h5py.File(path, "r+") as handle:
        del handle["ranks/device_pci_bus_id"]
    v7 = read_run(path)
    assert [(p.kind, p.excluded) for p in v7.problems] == [("missing field", False)]
    assert "/ranks/device_pci_bus_id" in v7.problems[0].message and v7.usable


def test_mpi_nodes_that_are_not_the_hosts_are_named(tmp_path):
    # Two hosts MPI took for one node (its shared-memory domain spans both), and one host
    # that MPI split in two.
    merged = write_run(tmp_path / "merged.h5", world_size=4, hostnames=FOUR_ON_TWO_HOSTS)
    rewrite(merged, "node_index", [0, 0, 0, 0])
    split = write_run(tmp_path / "split.h5", world_size=2, hostnames=["localhost"] * 2,
                      config=base_config(repeat=1))
    rewrite(split, "node_index", [0, 1])
    _, _, problems = load_results(tmp_path)
    by_file = {p.where.rsplit("/", 1)[-1]: p for p in problems}
    assert {name: p.kind for name, p in by_file.items()} == {"merged.h5": "placement",
                                                              "split.h5": "placement"}
    assert "MPI node 0 spans hosts ['node-a', 'node-b']" in by_file["merged.h5"].message
    assert "host localhost holds MPI nodes [0, 1]" in by_file["split.h5"].message
    # A version 6 file numbered its nodes from the hostnames: nothing to compare.
    old = write_run(tmp_path / "old" / "v6.h5", world_size=4, schema_version=6,
                    hostnames=FOUR_ON_TWO_HOSTS)
    rewrite(old, "node_index", [0, 0, 0, 0])
    assert read_run(old).problems == []


def test_ranks_that_drove_one_gpu_are_named_and_unqueried_gpus_are_not(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=4, backend="cuda", hostnames=FOUR_ON_TWO_HOSTS,
                     device_uuid=["GPU-a", "GPU-a", "GPU-b", "GPU-c"])
    problems = read_run(path).problems
    assert [(p.kind, p.excluded) for p in problems] == [("shared device", False)]
    assert "ranks [0, 1] drove GPU-a" in problems[0].message
    unqueried = ["unavailable: no CUDA device 0"] * 2 + ["", ""]
    assert read_run(write_run(tmp_path / "u.h5", world_size=4, backend="cuda",
                              device_uuid=unqueried)).problems == []


def _breakdown_rows(report):
    """{N: the breakdown table's "communication" cell} of a report with one series."""
    section = report.split("Median time per step on the slowest rank, by part [IQR]:", 1)[1]
    table = section.strip().split("\n\n", 1)[0]
    return {int(n): cell for n, cell in re.findall(r"^\| (\d) \| [^|]+ \| ([^|]+?) \|", table, re.MULTILINE)}


def test_the_report_shows_nodes_by_ranks_per_node_and_intra_or_inter_node_comm_for_every_n(tmp_path):
    write_run(tmp_path / "r" / "n1.h5", world_size=1, hostnames=["node-a"])
    write_run(tmp_path / "r" / "n2.h5", world_size=2, hostnames=["node-b", "node-b"])
    write_run(tmp_path / "r" / "n4.h5", world_size=4, hostnames=FOUR_ON_TWO_HOSTS)
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("Runs by nodes × ranks per node: 1 node × 1 rank (1), 1 node × 2 ranks (1), "
            "2 nodes × 2 ranks (1)") in report
    rows = re.findall(r"^\| (\d) \| (\d×\d) \|", report, re.MULTILINE)
    assert rows == [("1", "1×1"), ("2", "1×2"), ("4", "2×2")]
    series = (tmp_path / "out" / "series.csv").read_text().splitlines()
    assert series[0].split(",").count("topology") == 1
    assert _breakdown_rows(report) == {1: "—", 2: "intra-node comm", 4: "inter-node comm"}
    series = pd.read_csv(tmp_path / "out" / "series.csv")
    # One rank has no communication: its categorical cells are empty, not a dash.
    assert series["comm_scope"].fillna("").tolist() == ["", "intra-node", "inter-node"]
    assert series["link"].fillna("").tolist() == ["", "MPI (cpu backend)", "MPI (cpu backend)"]


def test_an_emulated_run_is_inter_node_never_nvlink_and_never_pooled_with_a_native_one(tmp_path):
    for n in (1, 2):
        write_run(tmp_path / "r" / f"native-n{n}.h5", world_size=n, backend="cuda", hostnames=["gpu-host"] * n)
        write_run(tmp_path / "r" / f"emulated-n{n}.h5", world_size=n, backend="cuda", hostnames=["gpu-host"] * n,
                  link_emulation="socket")
    runs, _, problems = load_results(tmp_path / "r")
    assert all(run.usable for run in runs)
    series_list, series_problems = group_series(runs)
    assert len(series_list) == 2 and [p.kind for p in series_problems] == ["mixed link_emulation"]
    by_emulation = {series.variant["link_emulation"]: series for series in series_list}
    emulated, native = by_emulation["socket"], by_emulation["none"]
    assert "[emulated inter-node (NET/Socket)]" in emulated.label and "emulated" not in native.label
    assert emulated.table["comm_scope"].tolist() == ["—", "inter-node"]
    assert emulated.table["link"].tolist() == ["—", "emulated inter-node (NET/Socket)"]
    assert native.table["comm_scope"].tolist() == ["—", "intra-node"] and native.table["link"].tolist() == ["—", "P2P"]
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Links between ranks (runs): P2P (1), emulated inter-node (NET/Socket) (1)" in report
    sections = report.split("### ")[1:]
    emulated_section = next(s for s in sections if s.startswith(f"{emulated.index}."))
    assert _breakdown_rows(emulated_section.replace("### ", "")) == {1: "—", 2: "inter-node comm"}
    assert "| P2P |" not in emulated_section


def test_an_emulated_run_whose_nccl_chose_another_transport_says_so(tmp_path):
    run = read_run(write_run(tmp_path / "run.h5", world_size=2, backend="cuda", link_emulation="socket",
                             nccl_transports="NET/Socket,NVLS"))
    assert machine.link_kind(run) == "emulated inter-node (NET/Socket + NVLS)"
    unknown = read_run(write_run(tmp_path / "u.h5", world_size=2, backend="cuda", link_emulation="socket",
                                 nccl_transports="unknown"))
    assert machine.link_kind(unknown) == "emulated inter-node (transport unknown)"


def test_files_before_version_8_read_as_not_emulated_with_their_transport_unknown(tmp_path):
    v7 = read_run(write_run(tmp_path / "v7.h5", world_size=2, backend="cuda", schema_version=7))
    assert v7.problems == [] and v7.rank_transports is None
    assert machine.link_emulation(v7) == "none" and machine.link_kind(v7) == "unknown"
    assert machine.comm_scope(v7) == "intra-node"
    cpu = read_run(write_run(tmp_path / "cpu.h5", world_size=2, schema_version=7))
    assert machine.transports(cpu) == "none" and machine.link_kind(cpu) == "MPI (cpu backend)"
    path = write_run(tmp_path / "v8.h5", world_size=2, backend="cuda")
    assert read_run(path).rank_transports == ["P2P", "P2P"]
    with h5py.File(path, "r+") as handle:
        del handle.attrs["nccl_transports"]
    v8 = read_run(path)
    assert [(p.kind, p.excluded) for p in v8.problems] == [("missing field", False)]
    assert "nccl_transports" in v8.problems[0].message and machine.link_kind(v8) == "unknown"
