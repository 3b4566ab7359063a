"""NCCL's tuning constants by version: the latencies (µs) and bandwidth shares with which
NCCL's own cost model (src/graph/tuning.cc, ncclTopoTuneModel) times each algorithm and
protocol and picks the fastest. The predictor times a collective as the NCCL version
recorded in the result files would, so that its algorithm choice is that NCCL's.

Tables are keyed by the first version they apply to; a version takes the newest table
at or below it. Read from NVIDIA/nccl:
- 2.7:  src/graph/tuning.cc of 2.7.5 (commit 01afd20a77b5, makefiles/version.mk 2.7.5).
- 2.20: src/graph/tuning.cc of 2.20.3 (commit b6475625fbca, makefiles/version.mk 2.20.3):
  NVLS, NVLS tree, a tree hop of 28 µs and a network ring step of 14 µs.
- 2.23: src/graph/tuning.cc as it stands with PAT (added in 2.23 for allgather and
  reduce-scatter at one GPU per node) and the Blackwell bandwidth tables: tree hops of
  4 µs (NVLink) and 14 µs (network), a Simple tree base of 8.4 µs, the network tree
  latency for every algorithm at one GPU per node, and PAT's own latency. These values
  were read in a tuning.cc carrying the Blackwell tables; 2.23 and 2.24, which have PAT
  but predate those tables, are assumed to share them.

LL's bus bandwidth cap (llMaxBws) is kept for a Hopper node and an Intel host. Left out:
the per-channel caps (perChMax*Bw), which depend on the channel count NCCL's search finds;
the tree correction factors by size; CollNet (needs SHARP-capable switches and a plugin).
"""
from dataclasses import dataclass

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
HARDWARE = ("nvlink", "pci", "net")


def _table(rows):
    """{(algorithm, protocol): µs} from {algorithm: (LL, LL128, Simple)}."""
    return {(algorithm, protocol): value for algorithm, values in rows.items()
            for protocol, value in zip(PROTOCOLS, values)}


@dataclass(frozen=True)
class NcclTuning:
    """NCCL's tuning constants from one version on: latencies in µs, bandwidth shares as
    fractions of the ring's bus, and which algorithms and caps the version has."""
    version: str                     # the first version these constants apply to
    source: str
    base_us: dict                    # baseLat[algorithm][protocol]
    hop_us: dict                     # hwLat[hw][algorithm][protocol]: {hw: {(a, p): µs}}
    tree_bus_share: float            # a tree's bus bandwidth over the ring's
    ring_ll_share: float             # LL ring's share of the bus (nodes > 1 or allreduce)
    ring_ll_share_single: float      # ... reduce-scatter and allgather inside one node
    tree_ll128_share_multi: float    # LL128 tree's share across nodes (7/9 inside one)
    allreduce_inter_steps_extra: int  # 2.20 counts 2·nodes network steps, others 2(nodes−1)
    net_overhead_us: float = 0.0     # a ring's intra-node step across nodes is at least this
    ll_intra_factor_multi_node: float = 1.0   # 2.7: LL's intra hop ×1.8 across nodes
    ring_plateau: float = 1.0        # 2.7: multi-node ring allreduce latency ×1.9 (large)
    one_gpu_per_node_tree_net: bool = False   # ppn = 1: every algorithm's network hop is the tree's
    has_pat: bool = False
    pat_base_us: float = 8.0
    pat_per_rank_us: float = 2.8
    pat_inter_divisor: float = 3.5
    pat_bus_share: float = 0.75
    nvls_share: float = 5.0 / 6.0    # NVLS's algorithm bandwidth over its bus bandwidth
    protocols: tuple = PROTOCOLS
    # llMaxBws: LL's bus bandwidth cap in GB/s by nodes (1, 2, 3 or more): inside one node
    # the Hopper row, across nodes the row of an Intel host. None: no cap (2.7).
    ll_max_bus_gb_per_s: tuple = None

    def ll_cap_bytes_per_s(self, nodes):
        if self.ll_max_bus_gb_per_s is None:
            return float("inf")
        return self.ll_max_bus_gb_per_s[min(nodes, 3) - 1] * 1e9

    def hop(self, hardware, algorithm, protocol):
        return self.hop_us[hardware].get((algorithm, protocol), 0.0)

    def base(self, algorithm, protocol):
        return self.base_us.get((algorithm, protocol), 0.0)


NCCL_2_7 = NcclTuning(
    version="2.7", source="NVIDIA/nccl src/graph/tuning.cc, 2.7.5 (01afd20a77b5)",
    base_us=_table({"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)}),
    hop_us={"nvlink": _table({"tree": (0.52, 1.2, 28.0), "ring": (0.47, 1.9, 3.4)}),
            "pci": _table({"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)}),
            "net": _table({"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)})},
    tree_bus_share=0.9, ring_ll_share=1 / 4, ring_ll_share_single=1 / 3,
    tree_ll128_share_multi=0.915, allreduce_inter_steps_extra=0,
    ll_intra_factor_multi_node=1.8, ring_plateau=1.9)

NCCL_2_20 = NcclTuning(
    version="2.20", source="NVIDIA/nccl src/graph/tuning.cc, 2.20.3 (b6475625fbca)",
    base_us=_table({"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}),
    hop_us={"nvlink": _table({"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4),
                              "nvls": (0, 0, 23.0), "nvls_tree": (0, 0, 23.0)}),
            "pci": _table({"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)}),
            "net": _table({"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0),
                           "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 14.0)})},
    tree_bus_share=0.92, ring_ll_share=1 / 4, ring_ll_share_single=1 / 3,
    tree_ll128_share_multi=120 / 128, allreduce_inter_steps_extra=2,
    net_overhead_us=1.0, ll_max_bus_gb_per_s=(87.7, 39.0, 20.4))

NCCL_2_23 = NcclTuning(
    version="2.23", source="NVIDIA/nccl src/graph/tuning.cc with PAT and the Blackwell "
                           "tables",
    base_us=_table({"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}),
    hop_us={"nvlink": _table({"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
                              "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0)}),
            "pci": _table({"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)}),
            "net": _table({"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
                           "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 14.0)})},
    tree_bus_share=0.92, ring_ll_share=1 / 2, ring_ll_share_single=1 / 2,
    tree_ll128_share_multi=120 / 128, allreduce_inter_steps_extra=0,
    net_overhead_us=1.0, one_gpu_per_node_tree_net=True, has_pat=True,
    ll_max_bus_gb_per_s=(141.0, 39.0, 20.4))

TABLES = (NCCL_2_7, NCCL_2_20, NCCL_2_23)


def parse_version(text):
    """(major, minor, patch) of "2.28.3"; None for text that names no version."""
    parts = str(text).strip().split(".")
    try:
        numbers = tuple(int(part) for part in parts[:3])
    except ValueError:
        return None
    return numbers + (0,) * (3 - len(numbers)) if numbers else None


def tuning_for(version_text):
    """The table of the newest version at or below version_text; the oldest for a
    version before it. None for a text that names no version (no NCCL: the CPU
    backend's MPI)."""
    version = parse_version(version_text)
    if version is None:
        return None
    chosen = TABLES[0]
    for table in TABLES:
        if parse_version(table.version) <= version:
            chosen = table
    return chosen


def flat_tuning(base_us, intra_us, inter_us, source):
    """Latencies given outright (a transport without NCCL's model): Simple ring and tree
    only, the same hop latency for both."""
    rows = lambda hop: _table({"tree": (0, 0, hop), "ring": (0, 0, hop)})  # noqa: E731
    return NcclTuning(version="", source=source, base_us=_table({"tree": (0, 0, base_us),
                                                                "ring": (0, 0, base_us)}),
                      hop_us={"nvlink": rows(intra_us), "pci": rows(intra_us),
                              "net": rows(inter_us)},
                      tree_bus_share=0.9, ring_ll_share=0.0, ring_ll_share_single=0.0,
                      tree_ll128_share_multi=0.0, allreduce_inter_steps_extra=0,
                      protocols=("Simple",))
