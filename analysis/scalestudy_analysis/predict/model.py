"""The scaling model of `scalestudy-predict`: network descriptions and the step, throughput and memory of one strategy at N
GPUs from fitted parameters (predict/fit.py fits them from a sweep).

The step at N GPUs with a micro-batch of b sequences per GPU and A micro-batches:

    step = A·t_c(b) + σ(b)·√(2 ln N) + t_opt(N) + exposed(N) + t_other
    t_c(b) = k·b^p                 (forward + backward of one micro-batch)
    σ(b)   = cv · A·t_c(b)          (per-rank jitter of compute; Eyerman et al.)
    exposed = C(N) − min(h·C(N), w·A·t_c(b))

with C(N) the sum of the step's collectives' times as NCCL's tuning model gives them
(predict/comm.py) (they run one after another
on the comm stream), h the share of them hidden behind compute in the sweep and w the
share of compute that communication can run beside. docs/strategies.md ("Predicting
larger clusters") gives the sources and what the model cannot know.
"""
import configparser
import math
from dataclasses import dataclass, field, replace

from scalestudy_analysis.predict.comm import CommParams, collective_time  # noqa: F401 (the model's API)
from scalestudy_analysis.results.schema import MEMORY_KIND_NAMES

GB = 1e9


class NetworkError(ValueError):
    """A network description that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Network:
    """Per-GPU figures of a cluster: bandwidth per direction in bytes/s; the GPU its
    nodes hold. Latencies come from NCCL's tuning constants of the version the runs
    recorded (predict/nccl_tuning.py); the latency keys serve runs without NCCL (MPI)."""
    name: str
    gpus_per_node: int
    intra_bandwidth_bytes_per_s: float
    inter_bandwidth_bytes_per_s: float
    gpu_model: str = ""             # "H100": matched against the runs' device names
    gpu_memory_bytes: float = math.inf
    nvls: bool = False
    latencies_us: tuple = None      # (base, intra, inter) for runs without NCCL
    source: str = ""

    def with_inter_bandwidth(self, bytes_per_s):
        return replace(self, inter_bandwidth_bytes_per_s=bytes_per_s)


REQUIRED_KEYS = {"gpus_per_node": int, "intra_bandwidth_gb_per_s": float,
                 "inter_bandwidth_gb_per_s": float}
LATENCY_KEYS = ("base_latency_us", "intra_latency_us", "inter_latency_us")
BOOLEAN_KEYS = ("nvls", "collnet")


def _number(path, section, key, kind, zero_allowed=False):
    text = section.get(key)
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise NetworkError(f"--network {str(path)!r}: {key} = {text!r} is not a "
                           "number") from None
    if not value > 0 and not (zero_allowed and value == 0):
        raise NetworkError(f"--network {str(path)!r}: {key} = {text!r} must be positive")
    return value


def _boolean(path, section, key):
    text = section.get(key, "no").strip().lower()
    if text not in ("yes", "no", "true", "false", "on", "off", "1", "0"):
        raise NetworkError(f"--network {str(path)!r}: {key} = {text!r} must be yes or no")
    return text in ("yes", "true", "on", "1")


def read_network(path):
    """Reads experiments/networks/*.ini: a [network] section with REQUIRED_KEYS, and
    optionally gpu_model, gpu_memory_gb, nvls, and the LATENCY_KEYS all three or none."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        if not parser.read(path):
            raise NetworkError(f"--network {str(path)!r}: cannot be read")
    except configparser.Error as error:
        raise NetworkError(f"--network {str(path)!r}: {str(error).splitlines()[0]}") from None
    if not parser.has_section("network"):
        raise NetworkError(f"--network {str(path)!r}: no [network] section")
    section = parser["network"]
    values = {key: _number(path, section, key, kind) for key, kind in REQUIRED_KEYS.items()}
    given = [key for key in LATENCY_KEYS if key in section]
    if given and len(given) != len(LATENCY_KEYS):
        raise NetworkError(f"--network {str(path)!r}: give all of {', '.join(LATENCY_KEYS)} "
                           "or none")
    latencies = tuple(_number(path, section, key, float, True) for key in given) or None
    if _boolean(path, section, "collnet"):
        raise NetworkError(f"--network {str(path)!r}: collnet = yes: CollNet (SHARP) is "
                           "not modelled")
    memory = (_number(path, section, "gpu_memory_gb", float) * GB
              if "gpu_memory_gb" in section else math.inf)
    return Network(name=section.get("name", str(path)), gpus_per_node=values["gpus_per_node"],
                   intra_bandwidth_bytes_per_s=values["intra_bandwidth_gb_per_s"] * GB,
                   inter_bandwidth_bytes_per_s=values["inter_bandwidth_gb_per_s"] * GB,
                   gpu_model=section.get("gpu_model", "").strip(), gpu_memory_bytes=memory,
                   nvls=_boolean(path, section, "nvls"), latencies_us=latencies,
                   source=section.get("source", ""))


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
    times, algorithms = [], {}
    for kind, payload in model.collectives:
        seconds, algorithm = collective_time(kind, payload, world_size, comm)
        times.append(seconds)
        if world_size > 1 and payload > 0:
            algorithms.setdefault(kind, set()).add(algorithm)
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
            "algorithms": "; ".join(f"{kind}: {', '.join(sorted(names))}"
                                    for kind, names in sorted(algorithms.items())) or "—"}
