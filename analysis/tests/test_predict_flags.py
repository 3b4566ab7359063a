"""What scalestudy-predict flags: memory per GPU beyond the network file's GPU, compute
measured on another GPU model (lifted by --compute-scale), micro-batches outside those
measured; in the table, the CSV and the plot."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scalestudy_analysis.predict.cli import main
from scalestudy_analysis.predict.plot import _plot_flagged
from scalestudy_analysis.predict.flags import FLAG_GPU, FLAG_MEMORY, gpu_mismatch
from scalestudy_analysis.predict.model import Network

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt2-small-strong-4xh200"
NDR = ROOT / "experiments" / "networks" / "ib-ndr-400.ini"
H200 = "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"


class _Summary:
    def __init__(self, device):
        self.device = device


@pytest.mark.parametrize("named, flagged", [("H100", True), ("H200", False), ("h200", False),
                                           ("H20", True), ("", False)])
def test_gpu_mismatch_matches_the_model_as_a_word(named, flagged):
    network = Network("n", 8, 450e9, 50e9, gpu_model=named)
    note = gpu_mismatch([_Summary(H200)], network)
    assert (note is not None) == flagged
    if flagged:
        assert H200 in note and named in note


def test_the_plot_marks_flagged_points():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = pd.DataFrame({"N": [1, 8, 64], "step_time_s": [0.1, 0.2, 0.3],
                         "exceeds_gpu_memory": [False, True, True],
                         "compute_on_other_gpu": [True, True, True]})
    figure, axis = plt.subplots()
    labelled = set()
    _plot_flagged(axis, rows, "step_time_s", 1e3, labelled)
    lines = {line.get_label(): line for line in axis.get_lines()}
    assert list(lines[FLAG_MEMORY].get_xdata()) == [8, 64]
    assert list(lines[FLAG_MEMORY].get_ydata()) == pytest.approx([200, 300])
    assert list(lines[FLAG_GPU].get_xdata()) == [1, 8, 64]
    plt.close(figure)


def test_memory_gpu_and_batch_flags_in_the_table(tmp_path):
    """--weak-batch 256 on the example: 191 GiB per GPU against the H100's 80 GB, compute
    measured on H200s, 256 sequences above the 32 measured. --compute-scale 0.5 lifts the
    GPU flag and halves the forward and backward of every prediction."""
    out = tmp_path / "flagged"
    sweep = tmp_path / "sweep"      # one strategy: the flags are per point, not per strategy
    shutil.copytree(EXAMPLE / "strong" / "ddp-overlap_on", sweep / "strong" / "ddp-overlap_on")
    base = [str(sweep), "--network", str(NDR), "--no-ledger", "--resamples", "20",
            "--weak-batch", "256"]
    assert main(base + ["--out", str(out)]) == 0
    predictions = pd.read_csv(out / "predictions.csv", keep_default_na=False)
    weak = predictions[predictions["scaling"] == "weak"]
    assert weak["exceeds_gpu_memory"].all() and weak["above_measured_batch"].all()
    assert (weak["memory_per_gpu_bytes"] > 80e9).all()
    strong = predictions[predictions["scaling"] == "strong"]
    assert not strong["exceeds_gpu_memory"].any()
    assert predictions["compute_on_other_gpu"].all()
    text = (out / "prediction.md").read_text()
    weak_table = text.split("## Weak scaling")[1].split("## What would it take")[0]
    assert weak_table.count("beyond GPU memory; compute on another GPU; micro-batch above "
                            "measured") == len(weak[weak["N"].isin((1, 2, 4, 8, 64, 512, 4096))])
    assert "(exceeds)" in weak_table and "names H100" in text

    scaled = tmp_path / "scaled"
    assert main(base + ["--out", str(scaled), "--compute-scale", "0.5"]) == 0
    lifted = pd.read_csv(scaled / "predictions.csv", keep_default_na=False)
    assert not lifted["compute_on_other_gpu"].any() and lifted["exceeds_gpu_memory"].any()
    before = json.loads((out / "predictions.json").read_text())["models"]
    after = json.loads((scaled / "predictions.json").read_text())["models"]
    for label in before:
        assert after[label]["compute_scale_s"] == pytest.approx(
            0.5 * before[label]["compute_scale_s"], rel=1e-12)
    assert main(base + ["--compute-scale", "0"]) == 2
