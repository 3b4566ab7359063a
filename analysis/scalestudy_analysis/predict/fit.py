"""Fitting the scaling model (predict/model.py) to a sweep's runs: one summary per run
(compute per micro-batch, jitter, optimizer, overlap, the collectives' durations,
memory), the fit of one strategy from those summaries, a bootstrap over the runs of
each N for the intervals, and the held-out check (fit below the largest N, predict it)."""
import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from scalestudy_analysis.predict.comm_fit import choose_tuning, fit_comm
from scalestudy_analysis.predict.model import MemoryModel, StepModel, predict_point
from scalestudy_analysis.results.machine import device_model
from scalestudy_analysis.results.schema import COLLECTIVE_NAMES, MEMORY_KIND_NAMES, PHASE

# 1.4826 · MAD estimates σ of a normal sample without the pull of a few slow steps.
MAD_TO_SIGMA = 1.4826
# Memory kinds that zero2 shards over the ranks; the others are whole on every rank.
SHARDED_KINDS = ("gradients", "optimizer", "communication")
# Memory kinds that grow with the micro-batch: activations and the backend's workspaces.
PER_SEQUENCE_KINDS = ("activations", "other")


@dataclass
class RunSummary:
    """What the fit takes from one usable run (summarize_run): placement and batch, times in
    seconds, jitter, one step's collectives and their durations, memory in bytes."""
    world_size: int
    ranks_per_node: int       # the measured packing; the held-out check predicts with it
    nodes: int
    micro_batch: float
    grad_accum: int
    seq: int
    compute_s: float          # per micro-batch, mean over ranks, median over steps
    jitter_cv: float          # across ranks within a step (NaN on one rank)
    step_jitter_cv: float     # across steps on one rank (robust), the fallback on one rank
    optimizer_s: float
    other_s: float
    comm_s: float             # the critical rank's communication per step
    exposed_s: float
    window_share: float
    step_s: float
    collectives: list         # [(kind, payload_bytes)] of one step, rank 0
    durations: pd.DataFrame   # [N, kind, payload_bytes, seconds] one row per collective
    memory: dict              # bytes by kind, the rank that holds the most
    nccl_version: str = ""    # as the file records it; "" on the CPU backend
    device: str = ""          # the devices' names, machine.device_model


def micro_batch(run):
    """(sequences per rank per micro-batch, gradient accumulation steps) of a run, from
    batch_per_rank or else global_batch / world_size; the first may be fractional."""
    config = run.config
    accum = max(1, int(config.get("grad_accum", "1")))
    per_rank = config.get("batch_per_rank")
    if per_rank:
        return float(per_rank) / accum, accum
    return float(config["global_batch"]) / run.world_size / accum, accum


def _median(values):
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def _window_share(run, busy):
    """Per step and rank, the share of compute that lies after the step's first
    collective began (communication can run beside that part only)."""
    iv = run.intervals
    compute_end = np.fmax(iv[:, :, PHASE["forward"], 1], iv[:, :, PHASE["backward"], 1])
    first = np.full(compute_end.shape, np.inf)
    pieces = run.quantities.pieces
    fresh = ~pieces.carried
    np.minimum.at(first, (pieces.row[fresh], pieces.rank[fresh]), pieces.begin[fresh])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip((compute_end - first) / run.quantities.compute_busy_per_rank, 0.0, 1.0)
    share = share[run.measured]
    return _median(share[np.isfinite(share)]) if np.isfinite(share).any() else math.nan


def collective_durations(run):
    """One row per collective call of the measured steps, matched across ranks by its
    place in the rank's order: the shortest duration over the ranks, since a rank that
    starts early waits inside the collective for the last to join."""
    columns = run.collectives
    frame = pd.DataFrame({name: np.asarray(columns[name]) for name in
                          ("row", "rank", "kind", "begin", "end", "payload_bytes")})
    frame = frame[run.measured[frame["row"].to_numpy()] & (frame["payload_bytes"] > 0)]
    if frame.empty or run.world_size < 2:
        return pd.DataFrame(columns=["N", "kind", "payload_bytes", "seconds"])
    frame = frame.sort_values(["row", "rank", "begin"], kind="mergesort")
    frame["order"] = frame.groupby(["row", "rank"]).cumcount()
    frame["seconds"] = frame["end"] - frame["begin"]
    calls = frame.groupby(["row", "order"]).agg(kind=("kind", "first"),
                                                payload_bytes=("payload_bytes", "first"),
                                                seconds=("seconds", "min")).reset_index()
    calls["kind"] = np.array(COLLECTIVE_NAMES)[calls["kind"].to_numpy()]
    calls["N"] = run.world_size
    return calls[["N", "kind", "payload_bytes", "seconds"]]


def _step_collectives(run):
    columns = run.collectives
    rows = np.asarray(columns["row"])
    measured_rows = np.flatnonzero(run.measured)
    if measured_rows.size == 0:
        return []
    keep = (rows == measured_rows[0]) & (np.asarray(columns["rank"]) == 0)
    order = np.argsort(np.asarray(columns["begin"])[keep], kind="stable")
    kinds = np.asarray(columns["kind"])[keep][order]
    payloads = np.asarray(columns["payload_bytes"])[keep][order]
    return [(COLLECTIVE_NAMES[int(k)], int(p)) for k, p in zip(kinds, payloads)]


def _largest_rank_memory(run):
    if run.memory_bytes is None or np.shape(run.memory_bytes) != (run.world_size,
                                                                   len(MEMORY_KIND_NAMES)):
        return {}
    per_rank = np.asarray(run.memory_bytes, dtype=np.float64)
    return dict(zip(MEMORY_KIND_NAMES, per_rank[int(np.argmax(per_rank.sum(axis=1)))]))


def summarize_run(run):
    """What the fit needs from one usable run."""
    batch, accum = micro_batch(run)
    q = run.quantities
    measured = run.measured
    busy = np.asarray(q.compute_busy_per_rank, dtype=np.float64)[measured]
    per_step = busy.mean(axis=1) / accum
    if run.world_size > 1:
        with np.errstate(invalid="ignore", divide="ignore"):
            cv = _median(busy.std(axis=1, ddof=1) / busy.mean(axis=1))
    else:
        cv = math.nan
    median = _median(per_step)
    step_cv = MAD_TO_SIGMA * _median(np.abs(per_step - median)) / median
    rows = np.flatnonzero(measured)
    critical = q.critical_rank[measured]
    return RunSummary(
        world_size=run.world_size, ranks_per_node=int(run.attrs.get("ranks_per_node",
                                                                   run.world_size)),
        nodes=int(run.attrs.get("nodes", 1)), micro_batch=batch, grad_accum=accum,
        seq=int(run.config.get("seq", "0")), compute_s=median, jitter_cv=cv,
        step_jitter_cv=step_cv, optimizer_s=_median(q.optimizer[measured]),
        other_s=_median(q.data[measured] + q.other[measured]),
        comm_s=_median(q.comm_per_rank[rows, critical]),
        exposed_s=_median(q.exposed_on_critical[measured]),
        window_share=_window_share(run, busy), step_s=_median(q.step_time[measured]),
        collectives=_step_collectives(run), durations=collective_durations(run),
        memory=_largest_rank_memory(run), nccl_version=str(run.attrs.get("nccl_version", "")),
        device=device_model(run))


def _least_squares(design, target, weights=None):
    design = np.asarray(design, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if weights is not None:
        design = design * weights[:, None]
        target = target * weights
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    return solution


def fit_compute(points):
    """(k, p) of t_c(b) = k·b^p, a straight line in log-log through (b, t_c). With one
    micro-batch only, p = 1: compute proportional to the batch."""
    frame = pd.DataFrame(points, columns=["b", "t"]).dropna()
    frame = frame[(frame["b"] > 0) & (frame["t"] > 0)]
    if frame["b"].nunique() < 2:
        return float(np.median(frame["t"] / frame["b"])), 1.0
    log_k, exponent = _least_squares(np.column_stack([np.ones(len(frame)), np.log(frame["b"])]),
                                     np.log(frame["t"]))
    return float(math.exp(log_k)), float(exponent)


def fit_optimizer(summaries, sharded):
    """(fixed, per whole model) of t_opt = fixed + per_model · (1/N for zero2, 1 for ddp)."""
    share = np.array([1.0 / s.world_size if sharded else 1.0 for s in summaries])
    times = np.array([s.optimizer_s for s in summaries])
    if len(set(np.round(share, 12))) < 2:
        return 0.0, float(np.median(times / share))
    fixed, per_model = _least_squares(np.column_stack([np.ones(len(share)), share]), times)
    if fixed < 0 or per_model < 0:   # noise past the physical range: keep the sum right
        return 0.0, float(np.median(times / share))
    return float(fixed), float(per_model)


def fit_memory(summaries, sharded):
    """Per kind, fixed + per_shard/N (kinds zero2 shards) or fixed + per_sequence·b
    (activations, workspaces), by least squares; one point gives the whole value to the
    term that scales (or to fixed for the kinds that do not)."""
    model = MemoryModel()
    points = [s for s in summaries if s.memory]
    if not points:
        return None
    for kind in MEMORY_KIND_NAMES:
        values = np.array([s.memory[kind] for s in points])
        if kind in PER_SEQUENCE_KINDS:
            scale = np.array([s.micro_batch for s in points])
            target = model.per_sequence
        elif sharded and kind in SHARDED_KINDS:
            scale = np.array([1.0 / s.world_size for s in points])
            target = model.per_shard
        else:
            model.fixed[kind] = float(np.median(values))
            continue
        if len(set(np.round(scale, 12))) < 2:
            target[kind] = float(np.median(values / scale)) if kind in PER_SEQUENCE_KINDS else 0.0
            model.fixed[kind] = 0.0 if kind in PER_SEQUENCE_KINDS else float(np.median(values))
            continue
        fixed, slope = _least_squares(np.column_stack([np.ones(len(scale)), scale]), values)
        model.fixed[kind], target[kind] = float(fixed), float(slope)
    return model


def _overlap(summaries, notes):
    """(h, w) from the largest N above 1: the share of communication hidden, and the
    share of compute it ran beside."""
    sizes = [s.world_size for s in summaries if s.world_size > 1 and s.comm_s > 0]
    if not sizes:
        notes.append("no communication between ranks measured: nothing is assumed hidden "
                     "(h = 0)")
        return 0.0, 1.0
    largest = [s for s in summaries if s.world_size == max(sizes)]
    hidden = _median([1.0 - s.exposed_s / s.comm_s for s in largest])
    window = _median([s.window_share for s in largest])
    return (min(max(hidden, 0.0), 1.0), window if math.isfinite(window) else 1.0)


def fit_model(label, sharded, summaries, network, extra_compute=(), bench_durations=None,
              bench_inter=None):
    """A StepModel from the run summaries of one series; extra_compute: (b, t_c) points of
    a one-GPU batch sweep; bench_durations: bench comm's points inside one node, which
    replace the records as the source of the intra-node latency and bandwidth;
    bench_inter: (durations, ranks per node, nodes) of bench comm across nodes, which
    calibrate the network step and bandwidth."""
    notes = []
    points = [(s.micro_batch, s.compute_s) for s in summaries] + list(extra_compute)
    scale, exponent = fit_compute(points)
    batches = sorted({round(b, 6) for b, _ in points})
    notes.append(f"t_c(b) = {scale * 1e3:.3g} ms · b^{exponent:.3f}, fitted on micro-batches "
                 + ", ".join(f"{b:g}" for b in batches)
                 + ("" if extra_compute else " (the sweep's own ranks: no batch sweep given)"))
    multi = [s.jitter_cv for s in summaries if s.world_size > 1 and math.isfinite(s.jitter_cv)]
    if multi:
        jitter = _median(multi)
        notes.append(f"σ = {100 * jitter:.2f} % of compute, across the ranks of a step")
    else:
        jitter = _median([s.step_jitter_cv for s in summaries])
        notes.append(f"σ = {100 * jitter:.2f} % of compute, across the steps of one rank "
                     "(no run with two ranks)")
    fixed, per_model = fit_optimizer(summaries, sharded)
    durations = bench_durations
    if durations is None:
        # Inside a node only: a run across nodes measured the network as well.
        frames = [s.durations for s in summaries if not s.durations.empty and s.nodes == 1]
        durations = pd.concat(frames, ignore_index=True) if frames else None
    comm = fit_comm(durations, network, notes, choose_tuning(summaries, network, notes),
                    bench_inter)
    if durations is not None:
        notes.append("latency and bandwidth inside a node come from " + (
            "the bench comm file" if bench_durations is not None else
            "the sweep's collective records of its one-node runs (no bench comm file)"))
    hidden, window = _overlap(summaries, notes)
    largest = max(summaries, key=lambda s: (s.world_size, len(s.collectives)))
    return StepModel(label=label, sharded=sharded, seq=largest.seq,
                     grad_accum=largest.grad_accum, compute_scale_s=scale,
                     compute_exponent=exponent, jitter_cv=jitter if math.isfinite(jitter) else 0.0,
                     optimizer_fixed_s=fixed, optimizer_per_model_s=per_model,
                     other_s=_median([s.other_s for s in summaries]),
                     collectives=largest.collectives, hidden_share=hidden,
                     window_share=window, comm=comm, memory=fit_memory(summaries, sharded),
                     notes=notes)


def resample(summaries, rng):
    """The runs of each N drawn with replacement: the spread between repeats enters the
    fitted parameters and through them every prediction."""
    by_size = {}
    for summary in summaries:
        by_size.setdefault(summary.world_size, []).append(summary)
    drawn = []
    for size in sorted(by_size):
        group = by_size[size]
        drawn.extend(group[i] for i in rng.integers(0, len(group), size=len(group)))
    return drawn


def bootstrap_models(label, sharded, summaries, network, resamples, rng, **kwargs):
    """`resamples` models fitted as fit_model fits them (kwargs go to it), each on the
    summaries drawn with replacement per N."""
    return [fit_model(label, sharded, resample(summaries, rng), network, **kwargs)
            for _ in range(resamples)]


def _predict_held(label, sharded, fitted, target, network, models_kwargs):
    """The fit on fitted and its prediction of target's median step, predicted as it was
    measured: its ranks per node, so that a run across nodes (or an emulated link)
    checks the network's terms."""
    model = fit_model(label, sharded, fitted, network, **(models_kwargs or {}))
    size, batch = target[0].world_size, target[0].micro_batch
    measured_comm = replace(model.comm, gpus_per_node=target[0].ranks_per_node)
    predicted = predict_point(model, size, batch, measured_comm)
    return model, predicted, _median([s.step_s for s in target])


def held_out(label, sharded, summaries, network, models_kwargs=None):
    """Fits on every N below the largest measured and predicts the largest: the signed
    error of the median step time. None when fewer than two N were measured."""
    sizes = sorted({s.world_size for s in summaries})
    if len(sizes) < 2:
        return None
    largest = sizes[-1]
    fitted = [s for s in summaries if s.world_size < largest]
    target = [s for s in summaries if s.world_size == largest]
    model, predicted, measured = _predict_held(label, sharded, fitted, target, network,
                                               models_kwargs)
    return {"strategy": label, "fit_N": sizes[:-1], "predicted_N": largest,
            "micro_batch": target[0].micro_batch, "predicted_step_s": predicted["step_time_s"],
            "measured_step_s": measured,
            "signed_error": predicted["step_time_s"] / measured - 1.0,
            "smallest_fitted_batch": min(s.micro_batch for s in fitted),
            "parts": predicted, "model": model}


def held_out_residuals(label, sharded, summaries, network, models_kwargs=None):
    """Every N predicted by a fit on the other N, and, where the runs span several node
    counts, every node count's runs predicted by a fit on the others (predict/error.py)."""
    from scalestudy_analysis.predict.error import Residual
    residuals = []
    groups = [("leave one N out", lambda s, size=size: s.world_size == size)
              for size in sorted({s.world_size for s in summaries})]
    node_counts = sorted({s.nodes for s in summaries})
    if len(node_counts) > 1:
        groups += [("leave one node count out", lambda s, count=count: s.nodes == count)
                   for count in node_counts]
    seen = set()
    for source, held in groups:
        fitted = [s for s in summaries if not held(s)]
        held_ids = frozenset(id(s) for s in summaries if held(s))
        if not fitted or held_ids in seen:    # one node count per N repeats leave-one-N-out
            continue
        seen.add(held_ids)
        for size in sorted({s.world_size for s in summaries if held(s)}):
            target = [s for s in summaries if held(s) and s.world_size == size]
            _, predicted, measured = _predict_held(label, sharded, fitted, target, network,
                                                   models_kwargs)
            residuals.append(Residual(label, source, size,
                                      sorted({s.world_size for s in fitted}),
                                      predicted["step_time_s"], measured))
    return residuals
