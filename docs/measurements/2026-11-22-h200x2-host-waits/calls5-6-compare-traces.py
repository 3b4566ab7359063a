"""Kernel time per step, by category and for forward and backward apart, of the traced
one-GPU runs on each GPU alone (call 5) and of the 2-GPU ddp+overlap run (call 6), all on
one machine. Run from this folder with h5py and numpy: python3 calls5-6-compare-traces.py"""
from collections import defaultdict

import h5py
import numpy as np

RUNS = {"GPU 0 alone": ("call5-trace-1gpu-dev0.h5", 0), "GPU 1 alone": ("call5-trace-1gpu-dev1.h5", 0),
        "2 GPUs, rank 0": ("call6-trace-2gpu-ddp.h5", 0), "2 GPUs, rank 1": ("call6-trace-2gpu-ddp.h5", 1)}


def per_step(path, rank):
    with h5py.File(path) as f:
        trace = f["kernel_trace/rank_%d" % rank]
        names = [n.decode() if isinstance(n, bytes) else n for n in trace["names"][:]]
        categories = list(f["kernel_trace"].attrs["category_names"])
        start, end = trace["start_ns"][:], trace["end_ns"][:]
        name, step, stream, category = trace["name"][:], trace["step"][:], trace["stream"][:], trace["category"][:]
    steps = np.unique(step)
    by_category, forward, backward = defaultdict(float), 0.0, 0.0
    for s in steps:
        kernels = np.where(step == s)[0]
        kernels = kernels[np.argsort(start[kernels])]
        # The fused cross-entropy kernel ends the forward.
        classifier = next(k for k in kernels if "cross_entropy" in names[name[k]])
        for k in kernels[stream[kernels] == 0]:
            us = (end[k] - start[k]) / 1e3 / len(steps)
            by_category[categories[category[k]]] += us
            if start[k] <= start[classifier]:
                forward += us
            else:
                backward += us
    return by_category, forward, backward


results = {label: per_step(*where) for label, where in RUNS.items()}
categories = sorted({c for r in results.values() for c in r[0]})
print("kernel time on the compute stream, us per step (mean of the traced steps)")
print("%-16s" % "", "".join("%16s" % label for label in results))
for c in categories:
    print("%-16s" % c, "".join("%16.0f" % r[0].get(c, 0.0) for r in results.values()))
print("%-16s" % "forward", "".join("%16.0f" % r[1] for r in results.values()))
print("%-16s" % "backward", "".join("%16.0f" % r[2] for r in results.values()))
print("%-16s" % "all", "".join("%16.0f" % (r[1] + r[2]) for r in results.values()))
