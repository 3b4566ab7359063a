"""Each point of a `bench layer` file against the roofline of its device: its TFLOP/s beside
the roof at its arithmetic intensity, min(compute peak, bandwidth × intensity).

The compute peak is the best GEMM rate at the layer file's own precision (a bf16 layer
against bf16 GEMMs), from `bench gemm` files of the same device given with it; the
bandwidth is the one of the roofline plot, the best elementwise rate at the largest size of
the `bench bandwidth` files. A bench file records no datasheet peak, so without those files
there is no roof: the section says so instead of guessing one.
"""
import math

import numpy as np

from scalestudy_analysis.render.markdown import fmt, percent, table

SIXTEEN_BIT = ("fp16", "bf16")


def layer_peak(roofline, precision):
    """(TFLOP/s, label) of the compute roof for a layer computed in `precision`."""
    if roofline is None or not roofline.gemm_peaks:
        return math.nan, "no gemm file for this device"
    return roofline.gemm_peaks.get(precision, (math.nan, f"no {precision} gemm point for this device"))


def roof_rows(bench, roofline):
    """The ok points with their roof, the fraction of it they reach and what bounds them."""
    precision = str(bench.attrs.get("precision", "fp32"))
    peak, _ = layer_peak(roofline, precision)
    bandwidth = roofline.bandwidth_gbs if roofline is not None else math.nan
    rows = bench.points[bench.points["status"] == "ok"].copy()
    memory_roof = bandwidth * rows["arithmetic_intensity"] / 1e3
    rows["roof_tflops"] = np.minimum(peak, memory_roof)  # NaN when either roof is unknown
    rows["bound"] = np.where(memory_roof < peak, "memory", "compute")
    rows["of_roof"] = rows["tflops"] / rows["roof_tflops"]
    rows["label"] = (rows["part"] + " " + rows["pass"] + " b" + rows["batch"].astype(str) + " s"
                     + rows["seq"].astype(str))
    return rows


def plot_layer_roof(rows, title, path):
    """Writes the PNG at `path`: one bar per row of roof_rows (measured TFLOP/s) with a tick
    at the roof for that row's arithmetic intensity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.6))
    positions = np.arange(len(rows))
    axis.barh(positions, rows["tflops"], color="tab:blue", alpha=0.8, label="measured")
    axis.scatter(rows["roof_tflops"], positions, marker="|", s=300, color="black", zorder=3,
                 label="roof at its intensity")
    axis.set_yticks(positions, rows["label"], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("TFLOP/s")
    axis.set_title(title, fontsize=9)
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def layer_section(bench, roofline, out_dir, figure_file):
    """Markdown lines: the points against the roof, its figure, and what the roof rests on."""
    precision = str(bench.attrs.get("precision", "fp32"))
    peak, peak_label = layer_peak(roofline, precision)
    bandwidth = roofline.bandwidth_gbs if roofline is not None else math.nan
    lines = ["", f"**Against the roofline of {bench.device}** ({precision})", ""]
    if not (math.isfinite(peak) and math.isfinite(bandwidth)):
        missing = [] if math.isfinite(peak) else [peak_label]
        missing += [] if math.isfinite(bandwidth) else ["no bandwidth file for this device"]
        return lines + [f"No roof: {'; '.join(missing)}. Give `bench gemm` (with {precision}) and "
                        "`bench bandwidth` files of the same device with the layer file."]
    rows = roof_rows(bench, roofline)
    plot_layer_roof(rows, f"{bench.path}: TFLOP/s and the roof at each intensity", out_dir / figure_file)
    lines += [f"Roofs: {peak:.4g} TFLOP/s ({peak_label}), {bandwidth:.4g} GB/s ({roofline.bandwidth_label}).", "",
              table(["point", "TFLOP/s", "FLOP/byte", "roof TFLOP/s", "of the roof", "bound by"],
                    [[r["label"], fmt(r["tflops"]), fmt(r["arithmetic_intensity"], 3), fmt(r["roof_tflops"]),
                      percent(r["of_roof"]), r["bound"]] for r in rows.to_dict("records")]),
              "", f"![layer against the roofline]({figure_file})"]
    # Older layer files counted fp32 elements at every precision ("...; fp32; ..."); newer
    # ones count elements of the file's precision.
    if precision in SIXTEEN_BIT and "; fp32;" in str(bench.method.get("byte_model", "")):
        lines += ["", f"The file's byte model counts fp32 elements; its {precision} kernels move about half those "
                      "bytes, so each intensity is about twice the one shown, and a memory roof twice as high."]
    return lines
