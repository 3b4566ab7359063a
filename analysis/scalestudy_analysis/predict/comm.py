"""Collective times as NCCL's tuning model computes them (predict/nccl_tuning.py holds the
constants of each version): for each algorithm NCCL offers for the collective at this
size and placement (ring; tree for allreduce; PAT for allgather and reduce-scatter at one
GPU per node where the version has it; NVLS and the NVLS tree for allreduce only where
the network file enables them) and each protocol (LL, LL128 inside a node, Simple), a
latency plus the bytes over that algorithm's bandwidth; the fastest is NCCL's choice.

Bandwidth: inside a node the bus bandwidth (fitted from the sweep or bench comm, else
the network file's); across nodes every ring channel leaves through one NIC and the
channels use every NIC of the node, so the bus bandwidth is the lesser of the node's bus
as the network file describes it and gpus_per_node × one GPU's network bandwidth. The
sweep's own fitted intra-node rate never caps it: that rate measures the sweep's node,
not the network's."""
import math
from dataclasses import dataclass

US = 1e-6
# LL128's share of the bus (tuning.cc: 0.92 with two or more GPUs a node, 0.7 with one).
LL128_RING_SHARE = {True: 0.92, False: 0.7}
LL128_TREE_SHARE_ONE_NODE = 7.0 / 9.0
TREE_LL_DIVISOR = 3.8
# A tree moves every byte up and down: its algorithm bandwidth is half its bus bandwidth.
TREE_ALGORITHM_SHARE = 0.5


@dataclass(frozen=True)
class CommParams:
    """What the collectives of one fit cost."""
    tuning: object                  # nccl_tuning.NcclTuning of the runs' NCCL version
    intra_bus_bytes_per_s: float    # inside one node: fitted, or the network file's
    node_bus_bytes_per_s: float     # the node's bus as the network file gives it
    inter_bytes_per_s: float        # one GPU's network bandwidth per direction
    gpus_per_node: int
    base_extra_s: float = 0.0       # measured per-call latency beyond the table's
    inter_latency_s: float = None   # a network step measured by bench comm across nodes
    nvls: bool = False


def node_count(world_size, gpus_per_node):
    """The nodes that world_size GPUs fill at gpus_per_node a node; at least 1."""
    return max(1, math.ceil(world_size / gpus_per_node))


def log2i(value):
    """NCCL's log2i: the floor of log2."""
    return int(math.floor(math.log2(value))) if value > 1 else 0


def ring_steps(kind, world_size, nodes, allreduce_extra=0):
    """(steps, of which across nodes) of a ring collective as NCCL counts them:
    allreduce 2(N−1) steps, 2(nodes−1) across (2.20 counts 2·nodes); reduce-scatter and
    allgather N−1, nodes−1 across."""
    if kind in ("allreduce", "barrier"):
        inter = 2 * (nodes - 1) + (allreduce_extra if nodes > 1 else 0)
        return 2 * (world_size - 1), min(inter, 2 * (world_size - 1))
    return world_size - 1, nodes - 1


def bus_factor(kind, world_size):
    """Bytes each GPU sends per payload byte (nccl-tests' bus factor)."""
    if kind == "allreduce":
        return 2.0 * (world_size - 1) / world_size
    if kind == "barrier":
        return 0.0
    if kind == "broadcast":
        return 1.0
    return (world_size - 1) / world_size


def bus_bandwidth(params, nodes):
    """A ring's bus bandwidth in bytes/s over `nodes` nodes: the intra-node bus on one node,
    else the lesser of the node's bus and gpus_per_node × one GPU's network bandwidth."""
    if nodes == 1:
        return params.intra_bus_bytes_per_s
    return min(params.node_bus_bytes_per_s, params.gpus_per_node * params.inter_bytes_per_s)


def _hops(params, algorithm, protocol, world_size, nodes):
    """(intra, inter) hop latencies in µs."""
    tuning = params.tuning
    intra = tuning.hop("nvlink", algorithm, protocol)
    if nodes > 1 and protocol == "LL":
        intra *= tuning.ll_intra_factor_multi_node
    one_per_node = world_size == nodes
    network_algorithm = "tree" if tuning.one_gpu_per_node_tree_net and one_per_node else algorithm
    inter = tuning.hop("net", network_algorithm, protocol)
    if params.inter_latency_s is not None:
        inter = params.inter_latency_s / US
    return intra, inter


def _latency(params, microseconds):
    return max(0.0, microseconds * US + params.base_extra_s)


def ring_time(kind, payload_bytes, world_size, params, protocol="Simple"):
    """Seconds of one `kind` collective of payload_bytes over world_size ranks by NCCL's ring
    and `protocol`, as the version's tuning model times it; 0 on one rank."""
    if world_size <= 1:
        return 0.0
    tuning = params.tuning
    nodes = node_count(world_size, params.gpus_per_node)
    steps, inter_steps = ring_steps(kind, world_size, nodes, tuning.allreduce_inter_steps_extra)
    intra, inter = _hops(params, "ring", protocol, world_size, nodes)
    if nodes > 1:   # a step inside a node still launches the network proxy's work
        intra = max(intra, tuning.net_overhead_us * (3 if protocol == "Simple" else 1))
    latency = tuning.base("ring", protocol) + (steps - inter_steps) * intra + inter_steps * inter
    if (nodes > 1 and kind == "allreduce" and protocol == "Simple"
            and payload_bytes >= world_size / 16 * 65536):
        latency *= tuning.ring_plateau
    if protocol == "LL":
        share = (tuning.ring_ll_share if nodes > 1 or kind == "allreduce"
                 else tuning.ring_ll_share_single)
    else:
        share = LL128_RING_SHARE[world_size / nodes >= 2] if protocol == "LL128" else 1.0
    bus = share * bus_bandwidth(params, nodes)
    if protocol == "LL":
        bus = min(bus, tuning.ll_cap_bytes_per_s(nodes))
    return _latency(params, latency) + bus_factor(kind, world_size) * payload_bytes / bus


def tree_time(payload_bytes, world_size, params, protocol="Simple"):
    """The tree allreduce: a chain inside each node and a binary tree across nodes, up
    and down, 2·((ranks per node − 1)·intra + log2(nodes)·inter) hops."""
    if world_size <= 1:
        return 0.0
    tuning = params.tuning
    nodes = node_count(world_size, params.gpus_per_node)
    per_node = min(world_size, params.gpus_per_node)
    intra, inter = _hops(params, "tree", protocol, world_size, nodes)
    latency = tuning.base("tree", protocol) + 2 * ((per_node - 1) * intra + log2i(nodes) * inter)
    share = tuning.tree_bus_share
    if protocol == "LL":
        share /= TREE_LL_DIVISOR
    elif protocol == "LL128":
        share *= LL128_TREE_SHARE_ONE_NODE if nodes == 1 else tuning.tree_ll128_share_multi
    bus = share * bus_bandwidth(params, nodes)
    if protocol == "LL":
        bus = min(bus, tuning.ll_cap_bytes_per_s(nodes))
    return _latency(params, latency) + payload_bytes / (TREE_ALGORITHM_SHARE * bus)


def pat_time(payload_bytes, world_size, params):
    """PAT (allgather, reduce-scatter; one GPU per node; Simple): a latency logarithmic
    in the nodes plus a linear part per rank, at 0.75 of the bus bandwidth."""
    tuning = params.tuning
    _, inter = _hops(params, "tree", "Simple", world_size, world_size)
    latency = (tuning.pat_base_us + log2i(world_size) * inter / tuning.pat_inter_divisor
               + world_size * tuning.pat_per_rank_us)
    bandwidth = tuning.pat_bus_share * bus_bandwidth(params, world_size)
    return _latency(params, latency) + payload_bytes / bandwidth


def nvls_time(payload_bytes, world_size, params):
    """NVLS allreduce inside a node; across nodes the NVLS tree (NVLS inside, a tree of
    log2(nodes) levels across, at half the network bandwidth beyond two nodes)."""
    tuning = params.tuning
    nodes = node_count(world_size, params.gpus_per_node)
    if nodes == 1:
        latency = tuning.hop("nvlink", "nvls", "Simple")
        bus = params.intra_bus_bytes_per_s
    else:
        latency = (tuning.base("nvls_tree", "Simple") + tuning.hop("nvlink", "nvls_tree", "Simple")
                   + 2 * log2i(nodes) * tuning.hop("net", "nvls_tree", "Simple"))
        network = params.gpus_per_node * params.inter_bytes_per_s / (1 if nodes <= 2 else 2)
        bus = min(params.node_bus_bytes_per_s, network)
    return _latency(params, latency) + payload_bytes / (tuning.nvls_share * bus)


def _candidates(kind, payload_bytes, world_size, params):
    tuning = params.tuning
    nodes = node_count(world_size, params.gpus_per_node)
    protocols = [p for p in tuning.protocols if p != "LL128" or nodes == 1]
    for protocol in protocols:
        yield ring_time(kind, payload_bytes, world_size, params, protocol), "ring/" + protocol
        if kind == "allreduce":
            yield tree_time(payload_bytes, world_size, params, protocol), "tree/" + protocol
    if kind in ("allgather", "reduce_scatter") and tuning.has_pat and nodes == world_size:
        yield pat_time(payload_bytes, world_size, params), "pat/Simple"
    if kind == "allreduce" and params.nvls and tuning.hop("nvlink", "nvls", "Simple") > 0:
        yield nvls_time(payload_bytes, world_size, params), ("nvls" if nodes == 1
                                                             else "nvls_tree") + "/Simple"


def collective_time(kind, payload_bytes, world_size, params):
    """(seconds, "algorithm/protocol"): the fastest of what NCCL offers, as its model
    times them."""
    if world_size <= 1:
        return 0.0, "ring/Simple"
    return min(_candidates(kind, payload_bytes, world_size, params), key=lambda c: c[0])
