"""Each GPU's SM clock, power and throttle reasons while busy (power above 300 W), in each
window of call 8's gpu_concurrent.sh run (CLOCKS=1). nvidia-smi's timestamps are UTC.
Run from this folder: python3 call8-clock-windows.py"""
import csv
import datetime
import re
import statistics

marks = [(m.group(1), float(m.group(2))) for line in open("call8-concurrent.log")
         if (m := re.match(r"# (.+) at ([\d.]+)", line))]
samples = []
with open("call8-clocks.csv") as f:
    rows = csv.reader(f)
    next(rows)
    for stamp, gpu, sm, _mem, power, temperature, reasons in rows:
        when = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f")
        samples.append((when.replace(tzinfo=datetime.timezone.utc).timestamp(), int(gpu), float(sm.split()[0]),
                        float(power.split()[0]), int(temperature), int(reasons, 16)))
SW_POWER_CAP = 0x4
for (label, begin), (_, end) in zip(marks, marks[1:]):
    if label == "round end":
        continue
    for gpu in (0, 1):
        busy = [s for s in samples if begin <= s[0] < end and s[1] == gpu and s[3] > 300]
        capped = sum(1 for s in busy if s[5] & SW_POWER_CAP)
        print("%-12s GPU %d: %2d busy samples, SM clock median %4.0f MHz (%4.0f-%4.0f), power median %3.0f W, "
              "power-capped in %d" % (label, gpu, len(busy), statistics.median(s[2] for s in busy),
                                      min(s[2] for s in busy), max(s[2] for s in busy),
                                      statistics.median(s[3] for s in busy), capped))
