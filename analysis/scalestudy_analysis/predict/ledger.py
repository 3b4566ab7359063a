"""The prediction ledger: predictions for N not yet measured, each keyed by its workload,
its network and the NCCL version it was fitted under, scored once a later sweep measures
the same workload at that N, on that network (the measured run's ranks per node are the
network's packing of N) under that NCCL. A prediction is never scored by a run of another
network or NCCL: an emulated-link "N = 8" is not an NVLink node of eight GPUs.

The ledger lives beside the predictions' output (OUT/prediction-ledger.json), never in
the sweep's folder unless --ledger names a file there."""
import json

import numpy as np

from scalestudy_analysis.predict.error import Residual

LEDGER_NAME = "prediction-ledger.json"
LEDGER_AHEAD = 2       # the ledger records the next powers of two above the largest N
WORKLOAD_KEYS = ("model", "seq", "precision", "global_batch", "batch_per_rank", "grad_accum")


def workload(study):
    """What was trained, as the ledger keys it: the model and batch of the series, its
    strategy and its scaling."""
    config = study.series.runs[0].config
    fields = {key: str(config.get(key, "")) for key in WORKLOAD_KEYS}
    if study.series.scaling == "weak":
        fields.pop("global_batch")
    else:
        fields.pop("batch_per_rank")
    return {"strategy": study.label, "scaling": study.series.scaling, **fields}


def placement(size, gpus_per_node):
    """Ranks per node of N GPUs packed onto nodes of gpus_per_node."""
    return min(size, gpus_per_node)


def _point_key(entry):
    return (json.dumps(entry["workload"], sort_keys=True), entry["N"],
            round(entry["micro_batch"], 6), entry["network"], entry["nccl_version"],
            entry["ranks_per_node"])


def measured_points(studies, network):
    """The median step time of every measured point under the ledger's key: a run counts
    on this network only where its ranks per node are the network's packing of its N."""
    points = {}
    for study in studies:
        key = json.dumps(workload(study), sort_keys=True)
        for summary in study.summaries:
            if summary.ranks_per_node != placement(summary.world_size, network.gpus_per_node):
                continue
            point = (key, summary.world_size, round(summary.micro_batch, 6), network.name,
                     summary.nccl_version, summary.ranks_per_node)
            points.setdefault(point, []).append(summary.step_s)
    return {key: float(np.median(steps)) for key, steps in points.items()}


def read_ledger(path):
    """The ledger at path, or an empty one; raises OSError, ValueError or KeyError for a
    file that is not a ledger."""
    if not path.is_file():
        return {"entries": []}
    ledger = json.loads(path.read_text())
    for entry in ledger["entries"]:
        _point_key(entry)
    return ledger


def score(ledger, measured, now):
    """Scores the open entries whose point is now measured."""
    for entry in ledger["entries"]:
        step = measured.get(_point_key(entry))
        if entry.get("score") is None and step is not None:
            entry["score"] = {"measured_step_s": step, "scored_utc": now,
                              "signed_error": entry["predicted_step_s"] / step - 1.0,
                              "inside_interval": entry["low_s"] <= step <= entry["high_s"]}


def residuals(ledger):
    """The scored entries as residuals of the model's error (predict/error.py)."""
    return [Residual(e["workload"]["strategy"], "ledger", e["N"], e["fit_N"],
                     e["predicted_step_s"], e["score"]["measured_step_s"])
            for e in ledger["entries"] if e.get("score")]


def record(ledger, study, rows, network, now):
    """Adds the predictions of rows (those of the next powers of two above the largest N
    measured), once per fit, network and NCCL version."""
    sizes = sorted({s.world_size for s in study.summaries})
    versions = sorted({s.nccl_version for s in study.summaries})
    recorded = {(_point_key(e), tuple(e["fit_N"])) for e in ledger["entries"]}
    for row in rows:
        entry = {"workload": workload(study), "N": row["N"], "micro_batch": row["micro_batch"],
                 "fit_N": sizes, "network": network.name, "nccl_version": "+".join(versions),
                 "ranks_per_node": placement(row["N"], network.gpus_per_node),
                 "made_utc": now, "predicted_step_s": row["step_time_s"],
                 "low_s": row["step_time_s_lo"], "high_s": row["step_time_s_hi"],
                 "score": None}
        if (_point_key(entry), tuple(sizes)) not in recorded:
            ledger["entries"].append(entry)


def ahead(study):
    """The world sizes the ledger records for a study: its largest measured N times 2, 4, ...
    up to 2**LEDGER_AHEAD."""
    sizes = sorted({s.world_size for s in study.summaries})
    return [sizes[-1] * 2 ** k for k in range(1, LEDGER_AHEAD + 1)]


def write_ledger(path, ledger):
    """Writes the ledger as indented JSON to `path`, creating its directory; an OSError
    reaches the caller."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ledger, indent=1) + "\n")
