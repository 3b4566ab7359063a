"""NCCL's tuning constants as the predictor uses them: the tables pinned to the values of
NVIDIA/nccl's src/graph/tuning.cc for 2.7.5 (commit 01afd20a77b5) and 2.20.3 (commit
b6475625fbca) and the table with PAT (2.23 and later), the version each recorded NCCL
maps to, and collective times computed by hand from them: the ring's network steps, the
tree's hops, PAT at one GPU per node where the version has it, NVLS only where the
network file enables it, and the node's bus never capped by the sweep's own fit."""
import pytest

from scalestudy_analysis.predict.nccl_tuning import (NCCL_2_20, NCCL_2_23, NCCL_2_7, flat_tuning,
                                             tuning_for)
from scalestudy_analysis.predict.comm import (CommParams, bus_bandwidth, collective_time,
                                              pat_time, ring_time, tree_time)

US = 1e-6


def _params(tuning, gpus_per_node=8, intra=450e9, inter=50e9, nvls=False):
    return CommParams(tuning=tuning, intra_bus_bytes_per_s=intra, node_bus_bytes_per_s=450e9,
                      inter_bytes_per_s=inter, gpus_per_node=gpus_per_node, nvls=nvls)


@pytest.mark.parametrize("recorded, table", [
    ("2.7.5", NCCL_2_7), ("2.6.4", NCCL_2_7), ("2.18.1", NCCL_2_7), ("2.20.3", NCCL_2_20),
    ("2.21.5", NCCL_2_20), ("2.23.4", NCCL_2_23), ("2.28.3", NCCL_2_23)])
def test_each_recorded_version_takes_the_newest_table_at_or_below_it(recorded, table):
    assert tuning_for(recorded) is table
    assert tuning_for("") is None and tuning_for("unknown") is None


def test_the_2_7_5_constants_are_those_of_its_tuning_cc():
    assert "2.7.5" in NCCL_2_7.source and "01afd20a" in NCCL_2_7.source
    assert [NCCL_2_7.base("tree", p) for p in ("LL", "LL128", "Simple")] == [4.4, 4.4, 0.0]
    assert [NCCL_2_7.base("ring", p) for p in ("LL", "LL128", "Simple")] == [3.6, 10.0, 8.4]
    assert [NCCL_2_7.hop("nvlink", "tree", p) for p in ("LL", "LL128", "Simple")] == [0.52, 1.2, 28]
    assert [NCCL_2_7.hop("nvlink", "ring", p) for p in ("LL", "LL128", "Simple")] == [0.47, 1.9, 3.4]
    assert [NCCL_2_7.hop("net", "tree", p) for p in ("LL", "LL128", "Simple")] == [5.0, 8.5, 50]
    assert [NCCL_2_7.hop("net", "ring", p) for p in ("LL", "LL128", "Simple")] == [2.7, 4.0, 9.6]
    assert not NCCL_2_7.has_pat and NCCL_2_7.hop("nvlink", "nvls", "Simple") == 0


def test_the_2_20_3_constants_are_those_of_its_tuning_cc():
    assert "2.20.3" in NCCL_2_20.source and "b6475625" in NCCL_2_20.source
    assert [NCCL_2_20.base("tree", p) for p in ("LL", "LL128", "Simple")] == [6.8, 14.0, 0.0]
    assert [NCCL_2_20.base("ring", p) for p in ("LL", "LL128", "Simple")] == [6.6, 14.0, 8.4]
    assert [NCCL_2_20.hop("nvlink", "tree", p) for p in ("LL", "LL128", "Simple")] == [0.6, 1.25, 28]
    assert [NCCL_2_20.hop("nvlink", "ring", p) for p in ("LL", "LL128", "Simple")] == [0.6, 1.9, 3.4]
    assert [NCCL_2_20.hop("net", "tree", p) for p in ("LL", "LL128", "Simple")] == [5.0, 8.5, 28]
    assert [NCCL_2_20.hop("net", "ring", p) for p in ("LL", "LL128", "Simple")] == [2.7, 4.0, 14.0]
    assert NCCL_2_20.hop("nvlink", "nvls", "Simple") == 23 and not NCCL_2_20.has_pat


def test_the_pat_table_constants():
    assert NCCL_2_23.has_pat and NCCL_2_23.base("tree", "Simple") == 8.4
    assert NCCL_2_23.hop("nvlink", "tree", "Simple") == 4.0
    assert NCCL_2_23.hop("net", "tree", "Simple") == 14 and NCCL_2_23.hop("net", "ring", "Simple") == 14


def test_a_two_node_ring_allreduce_by_hand_under_two_versions():
    """16 GPUs on 2 nodes of 8, 1 MB, Simple. 2.7.5: 30 steps, 2 across the network:
    8.4 + 28·3.4 + 2·9.6 = 122.8 µs, ×1.9 for the ring's plateau (1 MB ≥ 16/16·64 KiB).
    2.20.3: 2·nodes = 4 network steps at 14 µs, an intra step of max(3.4, 3·1) µs:
    8.4 + 26·3.4 + 4·14 = 152.8 µs. Bandwidth: 2·15/16·1e6 B over min(450, 8·50) GB/s."""
    transfer = 2 * 15 / 16 * 1e6 / 400e9
    for tuning, latency in ((NCCL_2_7, 122.8 * 1.9), (NCCL_2_20, 152.8)):
        # Float rounding only: the formula is closed-form.
        assert ring_time("allreduce", 1e6, 16, _params(tuning)) == pytest.approx(
            latency * US + transfer, rel=1e-9)


def test_a_tree_at_4096_gpus_by_hand_under_two_versions():
    """512 nodes of 8, Simple, no bytes: 2·(7 intra + 9 network hops). 2.20.3: tree hops of
    28 µs everywhere, no base: 896 µs. The PAT table: 8.4 + 2·(7·4 + 9·14) = 316.4 µs."""
    assert tree_time(0.0, 4096, _params(NCCL_2_20)) == pytest.approx(896 * US, rel=1e-9)
    assert tree_time(0.0, 4096, _params(NCCL_2_23)) == pytest.approx(316.4 * US, rel=1e-9)


def test_pat_at_one_gpu_per_node_where_the_version_has_it():
    """64 nodes of one GPU, allgather of 1 MB: PAT takes 8 + log2(64)·14/3.5 + 64·2.8 =
    211.2 µs and 1e6 B at 0.75 of 50 GB/s; the ring pays 63 network steps. 2.20.3 has no
    PAT; eight GPUs a node never take it."""
    one_per_node = _params(NCCL_2_23, gpus_per_node=1)
    expected = 211.2 * US + 1e6 / (0.75 * 50e9)
    assert pat_time(1e6, 64, one_per_node) == pytest.approx(expected, rel=1e-9)
    seconds, algorithm = collective_time("allgather", 1e6, 64, one_per_node)
    assert algorithm == "pat/Simple" and seconds == pytest.approx(expected, rel=1e-9)
    assert collective_time("reduce_scatter", 1e6, 64, one_per_node)[1] == "pat/Simple"
    assert not collective_time("allgather", 1e6, 64, _params(NCCL_2_20, 1))[1].startswith("pat")
    assert not collective_time("allgather", 1e6, 512, _params(NCCL_2_23))[1].startswith("pat")


def test_nvls_only_where_the_network_enables_it():
    # 8 GPUs of one node, 1 GB: NVLS's 25 µs and 5/6 of the bus against the ring's 2(N−1)/N.
    assert collective_time("allreduce", 1e9, 8, _params(NCCL_2_23))[1] == "ring/Simple"
    seconds, algorithm = collective_time("allreduce", 1e9, 8, _params(NCCL_2_23, nvls=True))
    assert algorithm == "nvls/Simple"
    assert seconds == pytest.approx(25 * US + 1e9 / (5 / 6 * 450e9), rel=1e-9)


def test_the_sweeps_intra_node_fit_never_caps_the_network():
    """A sweep whose node measured 222 GB/s: across nodes the bus is min(the network
    file's 450 GB/s node, 8 × the GPU's network bandwidth), so 400 GB/s on NDR-400 and
    200 GB/s on RoCE-200, not 222 for both."""
    assert bus_bandwidth(_params(NCCL_2_23, intra=222e9), 1) == 222e9
    assert bus_bandwidth(_params(NCCL_2_23, intra=222e9), 2) == 400e9
    assert bus_bandwidth(_params(NCCL_2_23, intra=222e9, inter=25e9), 2) == 200e9


def test_flat_latencies_serve_runs_without_nccl():
    params = _params(flat_tuning(8.4, 3.4, 9.6, "test"))
    # 4 GPUs of one node: 8.4 + 6·3.4 µs and 2·3/4·1e9 B at 450 GB/s; Simple only.
    seconds, algorithm = collective_time("allreduce", 1e9, 4, params)
    assert algorithm == "ring/Simple"
    assert seconds == pytest.approx(28.8 * US + 1.5e9 / 450e9, rel=1e-9)
