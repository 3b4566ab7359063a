"""Where a prediction says more than the model can know, it is flagged in the table and
the plot: memory per GPU beyond the GPU the network file names; compute measured on
another GPU model than the network file names (unless --compute-scale says how the two
compare); a micro-batch below or above those whose compute was measured."""
import re
from dataclasses import replace

FLAG_MEMORY = "beyond GPU memory"
FLAG_GPU = "compute on another GPU"
FLAG_BELOW = "micro-batch below measured"
FLAG_ABOVE = "micro-batch above measured"


def gpu_mismatch(summaries, network):
    """A sentence naming the measured and the described GPU where the network file names
    a GPU model that no measured device's name holds as a word; None otherwise."""
    if not network.gpu_model:
        return None
    devices = sorted({s.device for s in summaries if s.device})
    pattern = re.compile(r"(?<![A-Za-z0-9])" + re.escape(network.gpu_model) + r"(?![A-Za-z0-9])",
                         re.IGNORECASE)
    if not devices or any(pattern.search(device) for device in devices):
        return None
    return (f"compute was measured on {' + '.join(devices)}, and the network file names "
            f"{network.gpu_model}")


def scale_compute(model, factor):
    """The model with its forward and backward time multiplied by factor (the time on the
    network's GPU over the time on the measured one): --compute-scale."""
    return replace(model, compute_scale_s=model.compute_scale_s * factor)


def row_flags(row, study):
    """The flags of one prediction row."""
    flags = []
    if row["memory_per_gpu_bytes"] > study.gpu_memory_bytes:
        flags.append(FLAG_MEMORY)
    if study.gpu_flag:
        flags.append(FLAG_GPU)
    if row["micro_batch"] < study.smallest_batch - 1e-9:
        flags.append(FLAG_BELOW)
    if row["micro_batch"] > study.largest_batch + 1e-9:
        flags.append(FLAG_ABOVE)
    return flags
