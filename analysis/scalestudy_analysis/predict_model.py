"""The scaling model of `scalestudy-predict`: network descriptions, collective times in
NCCL's ring and tree forms, and the step, throughput and memory of one strategy at N
GPUs from fitted parameters (predict_fit.py fits them from a sweep).

The step at N GPUs with a micro-batch of b sequences per GPU and A micro-batches:

    step = A·t_c(b) + σ(b)·√(2 ln N) + t_opt(N) + exposed(N) + t_other
    t_c(b) = k·b^p                 (forward + backward of one micro-batch)
    σ(b)   = cv · A·t_c(b)          (per-rank jitter of compute; Eyerman et al.)
    exposed = C(N) − min(h·C(N), w·A·t_c(b))

with C(N) the sum of the step's collectives' modelled times (they run one after another
on the comm stream), h the share of them hidden behind compute in the sweep and w the
share of compute that communication can run beside. docs/strategies.md ("Predicting
larger clusters") gives the sources and what the model cannot know.
"""
import configparser
import math
from dataclasses import dataclass, field, replace

from .schema import MEMORY_KIND_NAMES

GB = 1e9
# NCCL's tuning model (src/graph/tuning.cc) takes a tree's bus bandwidth as 0.9 of the
# ring's and its algorithm bandwidth as half of that: every byte goes up and down the tree.
TREE_BANDWIDTH_SHARE = 0.9
RING_KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "barrier")


class NetworkError(ValueError):
    """A network description that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Network:
    """Per-GPU figures of a cluster: bandwidth per direction in bytes/s, latency per ring
    step (NCCL's per-hop latency) in seconds."""
    name: str
    gpus_per_node: int
    intra_bandwidth_bytes_per_s: float
    intra_latency_s: float
    inter_bandwidth_bytes_per_s: float
    inter_latency_s: float
    base_latency_s: float
    source: str = ""

    def with_inter_bandwidth(self, bytes_per_s):
        return replace(self, inter_bandwidth_bytes_per_s=bytes_per_s)


NETWORK_KEYS = {"gpus_per_node": int, "intra_bandwidth_gb_per_s": float,
                "intra_latency_us": float, "inter_bandwidth_gb_per_s": float,
                "inter_latency_us": float, "base_latency_us": float}


def read_network(path):
    """Reads experiments/networks/*.ini: a [network] section with NETWORK_KEYS."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        if not parser.read(path):
            raise NetworkError(f"--network {str(path)!r}: cannot be read")
    except configparser.Error as error:
        raise NetworkError(f"--network {str(path)!r}: {str(error).splitlines()[0]}") from None
    if not parser.has_section("network"):
        raise NetworkError(f"--network {str(path)!r}: no [network] section")
    section = parser["network"]
    values = {}
    for key, kind in NETWORK_KEYS.items():
        text = section.get(key)
        try:
            values[key] = kind(text)
        except (TypeError, ValueError):
            raise NetworkError(f"--network {str(path)!r}: {key} = {text!r} is not a "
                               "number") from None
        if not values[key] > 0 and not (key.endswith("latency_us") and values[key] == 0):
            raise NetworkError(f"--network {str(path)!r}: {key} = {text!r} must be positive")
    return Network(name=section.get("name", str(path)), gpus_per_node=values["gpus_per_node"],
                   intra_bandwidth_bytes_per_s=values["intra_bandwidth_gb_per_s"] * GB,
                   intra_latency_s=values["intra_latency_us"] * 1e-6,
                   inter_bandwidth_bytes_per_s=values["inter_bandwidth_gb_per_s"] * GB,
                   inter_latency_s=values["inter_latency_us"] * 1e-6,
                   base_latency_s=values["base_latency_us"] * 1e-6,
                   source=section.get("source", ""))


@dataclass(frozen=True)
class CommParams:
    """What one collective costs: a fixed latency per call, a latency per ring step (or
    tree level) inside a node and across nodes, the bus bandwidth inside a node and the
    network bandwidth of one GPU across nodes."""
    base_latency_s: float
    intra_latency_s: float
    intra_bus_bytes_per_s: float
    inter_latency_s: float
    inter_bytes_per_s: float
    gpus_per_node: int


def node_count(world_size, gpus_per_node):
    return max(1, math.ceil(world_size / gpus_per_node))


def ring_steps(kind, world_size, nodes):
    """(steps, of which across nodes) of a ring collective, as NCCL's tuning model counts
    them: allreduce is a reduce-scatter and an allgather, 2(N−1) steps, 2(nodes−1) of them
    leaving a node; reduce-scatter and allgather N−1, nodes−1 across."""
    if kind == "allreduce" or kind == "barrier":
        return 2 * (world_size - 1), 2 * (nodes - 1)
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
    """A ring inside one node runs at the node's bus bandwidth. Across nodes each ring
    channel leaves a node through one GPU's NIC, and the channels together use every NIC
    of the node, so the bus bandwidth is the lesser of the node's and gpus_per_node × one
    GPU's network bandwidth."""
    if nodes == 1:
        return params.intra_bus_bytes_per_s
    return min(params.intra_bus_bytes_per_s, params.gpus_per_node * params.inter_bytes_per_s)


def ring_time(kind, payload_bytes, world_size, params):
    if world_size <= 1:
        return 0.0
    nodes = node_count(world_size, params.gpus_per_node)
    steps, inter_steps = ring_steps(kind, world_size, nodes)
    latency = (params.base_latency_s + (steps - inter_steps) * params.intra_latency_s
               + inter_steps * params.inter_latency_s)
    return latency + bus_factor(kind, world_size) * payload_bytes / bus_bandwidth(params, nodes)


def tree_time(payload_bytes, world_size, params):
    """NCCL's tree allreduce: a chain inside each node and a binary tree across nodes,
    up and down, 2·((ranks per node − 1)·intra + log2(nodes)·inter) hops; every byte
    crosses at half the tree's bus bandwidth."""
    if world_size <= 1:
        return 0.0
    nodes = node_count(world_size, params.gpus_per_node)
    per_node = min(world_size, params.gpus_per_node)
    levels = int(math.floor(math.log2(nodes))) if nodes > 1 else 0  # NCCL's log2i
    latency = params.base_latency_s + 2 * ((per_node - 1) * params.intra_latency_s
                                           + levels * params.inter_latency_s)
    bandwidth = 0.5 * TREE_BANDWIDTH_SHARE * bus_bandwidth(params, nodes)
    return latency + payload_bytes / bandwidth


def collective_time(kind, payload_bytes, world_size, params):
    """(seconds, algorithm): NCCL offers the tree for allreduce only, and picks whichever
    its model predicts faster at this size."""
    ring = ring_time(kind, payload_bytes, world_size, params)
    if kind != "allreduce" or world_size <= 1:
        return ring, "ring"
    tree = tree_time(payload_bytes, world_size, params)
    return (tree, "tree") if tree < ring else (ring, "ring")


@dataclass
class MemoryModel:
    """Bytes per GPU of each kind as fixed + per_shard / N + per_sequence · b."""
    fixed: dict = field(default_factory=dict)
    per_shard: dict = field(default_factory=dict)
    per_sequence: dict = field(default_factory=dict)

    def bytes_at(self, world_size, micro_batch):
        return {kind: self.fixed.get(kind, 0.0) + self.per_shard.get(kind, 0.0) / world_size
                + self.per_sequence.get(kind, 0.0) * micro_batch for kind in MEMORY_KIND_NAMES}


@dataclass
class StepModel:
    """The fitted parameters of one strategy (one series of the sweep)."""
    label: str
    sharded: bool                   # zero2: the optimizer updates a 1/N shard
    seq: int
    grad_accum: int
    compute_scale_s: float          # k of t_c(b) = k·b^p
    compute_exponent: float         # p
    jitter_cv: float                # σ of a rank's compute over its mean
    optimizer_fixed_s: float
    optimizer_per_model_s: float    # time to update the whole model
    other_s: float                  # data and host gaps on the critical path
    collectives: list               # [(kind, payload_bytes)] of one step
    hidden_share: float             # h
    window_share: float             # w
    comm: CommParams = None
    memory: MemoryModel = None
    notes: list = field(default_factory=list)

    def compute_s(self, micro_batch):
        return self.grad_accum * self.compute_scale_s * micro_batch ** self.compute_exponent


def predict_point(model, world_size, micro_batch, comm=None):
    """Every part of the step at N GPUs and b sequences per micro-batch, in seconds, with
    tokens/s and memory per GPU."""
    comm = comm or model.comm
    compute = model.compute_s(micro_batch)
    straggler = (model.jitter_cv * compute * math.sqrt(2.0 * math.log(world_size))
                 if world_size > 1 else 0.0)
    share = 1.0 / world_size if model.sharded else 1.0
    optimizer = model.optimizer_fixed_s + model.optimizer_per_model_s * share
    times, algorithms = [], set()
    for kind, payload in model.collectives:
        seconds, algorithm = collective_time(kind, payload, world_size, comm)
        times.append(seconds)
        if world_size > 1 and kind == "allreduce" and payload > 0:
            algorithms.add(algorithm)
    comm_s = float(sum(times))
    # Hidden communication runs beside compute and cannot outlast it: what grows past
    # the window it hides in is exposed.
    hidden = min(model.hidden_share * comm_s, model.window_share * compute)
    exposed = comm_s - hidden
    step = compute + straggler + optimizer + exposed + model.other_s
    tokens = world_size * micro_batch * model.grad_accum * model.seq
    memory = model.memory.bytes_at(world_size, micro_batch) if model.memory else {}
    return {"N": world_size, "micro_batch": micro_batch, "step_time_s": step,
            "compute_s": compute, "straggler_s": straggler, "optimizer_s": optimizer,
            "comm_s": comm_s, "exposed_comm_s": exposed, "other_s": model.other_s,
            "tokens_per_s": tokens / step, "memory_per_gpu_bytes": float(sum(memory.values())),
            "allreduce_algorithm": "/".join(sorted(algorithms)) or "—"}
