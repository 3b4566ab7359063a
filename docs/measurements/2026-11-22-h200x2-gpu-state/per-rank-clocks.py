"""Per result file of call5-state-h5.tgz: the median step (slowest rank), and per rank the
median over the measured steps of the step's mean SM clock and power, the samples per step
and the share of samples at the software power cap.
Usage: mkdir x && tar xzf call5-state-h5.tgz -C x && python3 per-rank-clocks.py x"""
import glob
import sys

import h5py
import numpy as np

for path in sorted(glob.glob(f"{sys.argv[1]}/*.h5")):
    with h5py.File(path, "r") as handle:
        steps = handle["steps"]
        measured = (steps["warmup"][...] == 0) & (steps["traced"][...] == 0)
        step_s = steps["intervals"][...][measured][:, :, 6, 1].max(axis=1)
        samples = steps["gpu_samples"][...][measured]
        if samples.sum() == 0:
            print(f"{path.split('/')[-1]:26s} step {np.median(step_s) * 1e3:7.2f} ms  (not sampled)")
            continue
        clock = np.median(steps["gpu_sm_clock_mhz"][...][measured], axis=0)
        power = np.median(steps["gpu_power_w"][...][measured], axis=0)
        capped = np.nanmean(steps["gpu_power_capped"][...][measured], axis=0)
        print(f"{path.split('/')[-1]:26s} step {np.median(step_s) * 1e3:7.2f} ms  SM clock per rank "
              f"{clock.round(0).tolist()} MHz  power {power.round(0).tolist()} W  samples per step "
              f"{samples.mean(axis=0).round(1).tolist()}  power-capped {capped.round(2).tolist()}")
