"""The communication terms of a fit: which NCCL's tuning constants time the collectives
(the version the runs recorded), the per-call latency and bus bandwidth inside a node
(from bench comm or the sweep's collective records), and, where bench comm measured
across nodes, the network step's latency and one GPU's network bandwidth."""
from collections import Counter

import numpy as np

from scalestudy_analysis.predict.nccl_tuning import flat_tuning, tuning_for
from scalestudy_analysis.predict.comm import CommParams, bus_factor, ring_steps
from scalestudy_analysis.predict.model import NetworkError

US = 1e-6
FITTED_KINDS = ("allreduce", "reduce_scatter", "allgather")


def choose_tuning(summaries, network, notes):
    """The NCCL tuning table of the runs' recorded version (the most common where they
    differ); the network file's latencies for runs without NCCL."""
    versions = Counter(s.nccl_version for s in summaries if s.nccl_version)
    if versions:
        version = versions.most_common(1)[0][0]
        tuning = tuning_for(version)
        if tuning is not None:
            notes.append(f"NCCL {version} recorded: latencies and algorithm choice from the "
                         f"tuning constants of NCCL {tuning.version} and later ({tuning.source})")
            return tuning
    if network.latencies_us is None:
        raise NetworkError("--network: the runs record no NCCL version (MPI on the CPU "
                           "backend), so NCCL's latencies do not apply: give base_latency_us, "
                           "intra_latency_us and inter_latency_us")
    notes.append("no NCCL version recorded: the network file's latencies")
    return flat_tuning(*network.latencies_us, source="the network file's latencies")


def _medians(durations):
    grouped = (durations.groupby(["N", "kind", "payload_bytes"])["seconds"].median()
               .reset_index())
    return grouped[grouped["kind"].isin(FITTED_KINDS)]


def _weighted_fit(design, target, seconds):
    """Least squares weighted by 1/t, so that small and large messages count alike."""
    weights = 1.0 / np.asarray(seconds, dtype=np.float64)
    solution, *_ = np.linalg.lstsq(np.asarray(design) * weights[:, None],
                                   np.asarray(target) * weights, rcond=None)
    return solution


def fit_intra(durations, tuning, notes):
    """(extra per-call latency in s, bus bandwidth in bytes/s) inside one node, or None:
    t − base − steps·hop = extra + bus_factor·S / B over the ring's Simple constants, the
    protocol NCCL takes for the large messages that carry the bandwidth."""
    grouped = _medians(durations)
    if len(grouped) < 2 or grouped["payload_bytes"].nunique() < 2:
        return None
    hop = tuning.hop("nvlink", "ring", "Simple") * US
    steps = np.array([ring_steps(k, n, 1)[0] for k, n in zip(grouped["kind"], grouped["N"])])
    factor = np.array([bus_factor(k, n) for k, n in zip(grouped["kind"], grouped["N"])])
    target = grouped["seconds"].to_numpy() - tuning.base("ring", "Simple") * US - steps * hop
    extra, inverse = _weighted_fit(np.column_stack([np.ones(len(grouped)),
                                                    factor * grouped["payload_bytes"]]),
                                   target, grouped["seconds"])
    if not inverse > 0:
        notes.append("the measured durations inside a node give no positive bandwidth; the "
                     "network file's intra-node figure is used")
        return None
    extra = max(float(extra), -tuning.base("ring", "Simple") * US)
    notes.append(f"inside a node, {extra * 1e6:+.1f} µs a call beyond NCCL's base latency and "
                 f"a bus bandwidth of {1e-9 / inverse:.0f} GB/s, fitted from {len(grouped)} "
                 "(N, collective, size) medians")
    return extra, 1.0 / float(inverse)


def fit_inter(durations, tuning, base_extra_s, intra_bus, ranks_per_node, nodes, notes):
    """(network step latency in s, one GPU's network bandwidth in bytes/s) from bench
    comm across nodes, or None: t − base − extra − intra steps·hop = inter steps·α +
    bus_factor·S / B_bus, and one GPU's share is B_bus / ranks per node."""
    grouped = _medians(durations)
    if len(grouped) < 2 or grouped["payload_bytes"].nunique() < 2:
        return None
    hop = tuning.hop("nvlink", "ring", "Simple") * US
    counted = [ring_steps(k, n, nodes, tuning.allreduce_inter_steps_extra)
               for k, n in zip(grouped["kind"], grouped["N"])]
    inter = np.array([c[1] for c in counted], dtype=np.float64)
    intra = np.array([c[0] - c[1] for c in counted], dtype=np.float64)
    factor = np.array([bus_factor(k, n) for k, n in zip(grouped["kind"], grouped["N"])])
    target = (grouped["seconds"].to_numpy() - tuning.base("ring", "Simple") * US - base_extra_s
              - intra * hop)
    step, inverse = _weighted_fit(np.column_stack([inter, factor * grouped["payload_bytes"]]),
                                  target, grouped["seconds"])
    if not inverse > 0:
        notes.append("bench comm across nodes gives no positive bandwidth; the network "
                     "file's figure is used")
        return None
    per_gpu = 1.0 / float(inverse) / ranks_per_node
    step = max(float(step), 0.0)
    notes.append(f"across nodes, {step * 1e6:.1f} µs a network step and {per_gpu / 1e9:.3g} "
                 f"GB/s per GPU, calibrated by bench comm on {nodes} nodes "
                 "(they replace the network file's figures)")
    return step, per_gpu


def fit_comm(durations, network, notes, tuning, inter=None):
    """CommParams from the measured durations inside a node (bench comm's or the sweep's
    records; None: the network file's bandwidth) and inter, a (durations, ranks per node,
    nodes) of bench comm across nodes, or None."""
    extra, bus = 0.0, network.intra_bandwidth_bytes_per_s
    fitted = fit_intra(durations, tuning, notes) if durations is not None and not durations.empty \
        else None
    if fitted is None and (durations is None or durations.empty):
        notes.append("no collective between ranks measured inside a node: the network file's "
                     "intra-node bandwidth is used")
    if fitted is not None:
        extra, bus = fitted
    step, per_gpu = None, network.inter_bandwidth_bytes_per_s
    if inter is not None:
        calibrated = fit_inter(inter[0], tuning, extra, bus, inter[1], inter[2], notes)
        if calibrated is not None:
            step, per_gpu = calibrated
    return CommParams(tuning=tuning, intra_bus_bytes_per_s=bus,
                      node_bus_bytes_per_s=network.intra_bandwidth_bytes_per_s,
                      inter_bytes_per_s=per_gpu, gpus_per_node=network.gpus_per_node,
                      base_extra_s=extra, inter_latency_s=step, nvls=network.nvls)
