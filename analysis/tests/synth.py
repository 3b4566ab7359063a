"""Writes synthetic result files (schema v8, or v1 to v7 on request) with h5py, for tests
with known answers.

The stored /summary is computed here by a deliberately naive reference (Python loops over
intervals), independent of the package's vectorised code, so that the summary check in
the loader compares two implementations of docs/results-schema.md.
"""
import math
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

PHASES = ["data", "forward", "backward", "grad-comm", "optimizer", "param-gather", "step"]
COLLECTIVES = ["allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"]
MEMORY_KINDS = ["parameters", "gradients", "optimizer", "activations", "communication", "other"]
KERNEL_CATEGORIES = ["gemm", "attention", "norm_elementwise", "optimizer", "communication",
                     "memory", "other"]
KERNEL_KINDS = ["kernel", "memcpy", "memset"]
STREAMS = ["compute", "comm", "stream 7"]
# /steps/gpu_* (version 3) with their dtype, units and value where a step has no samples.
GPU_DATASETS = {
    "gpu_samples": (np.int64, None, 0),
    "gpu_sm_clock_mhz": (np.float64, "MHz", math.nan),
    "gpu_sm_clock_min_mhz": (np.float64, "MHz", math.nan),
    "gpu_power_w": (np.float64, "W", math.nan),
    "gpu_temperature_c": (np.float64, "degC", math.nan),
    "gpu_power_capped": (np.float64, None, math.nan),
    "gpu_clock_event_reasons": (np.int64, None, 0),
}
# /steps/gpu_phase_* (version 4), likewise; each [S, R, P] with P in PHASES order.
GPU_PHASE_DATASETS = {
    "gpu_phase_samples": (np.int64, None, 0),
    "gpu_phase_sm_clock_mhz": (np.float64, "MHz", math.nan),
    "gpu_phase_power_w": (np.float64, "W", math.nan),
}

# Fractions of the step: ddp without overlap, so the allreduce is fully exposed.
DEFAULT_LAYOUT = {"data": (0.0, 0.05), "forward": (0.05, 0.35), "backward": (0.35, 0.85),
                  "grad-comm": (0.85, 0.95), "optimizer": (0.95, 1.0)}
DEFAULT_COLLECTIVE = ("allreduce", "grad-comm", 0.85, 0.95)


def layout_intervals(step_lengths, layout=None):
    """[S, R, P, 2] intervals placing each phase at fixed fractions of its step."""
    layout = DEFAULT_LAYOUT if layout is None else layout
    step_lengths = np.asarray(step_lengths, dtype=float)
    intervals = np.full(step_lengths.shape + (len(PHASES), 2), np.nan)
    for phase, (begin, end) in layout.items():
        index = PHASES.index(phase)
        intervals[..., index, 0] = begin * step_lengths
        intervals[..., index, 1] = end * step_lengths
    intervals[..., PHASES.index("step"), 0] = 0.0
    intervals[..., PHASES.index("step"), 1] = step_lengths
    return intervals


def layout_collectives(step_lengths, step_index, payload_bytes=1 << 20,
                       spec=DEFAULT_COLLECTIVE):
    """One collective per step per rank at fixed fractions of the step."""
    kind, phase, begin, end = spec
    rows = []
    n_steps, n_ranks = step_lengths.shape
    for row in range(n_steps):
        for rank in range(n_ranks):
            length = step_lengths[row, rank]
            rows.append((int(step_index[row]), rank, COLLECTIVES.index(kind),
                         PHASES.index(phase), begin * length, end * length, payload_bytes))
    return rows


def _union(pairs):
    merged = []
    for begin, end in sorted(pairs):
        if end <= begin:
            continue
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return merged


def _length(pairs):
    return sum(end - begin for begin, end in pairs)


def _intersection(first, second):
    return sum(max(0.0, min(e1, e2) - max(b1, b2)) for b1, e1 in first for b2, e2 in second)


def reference_step_time(intervals, i):
    return max(intervals[i, r, 6, 1] - intervals[i, r, 6, 0] for r in range(intervals.shape[1]))


def reference_summary(intervals, warmup, tokens, step_index, collectives, world_size,
                      flops_per_step, peak, peak_source, traced=None):
    traced = np.zeros(len(warmup)) if traced is None else traced
    measured = [i for i in range(len(warmup)) if warmup[i] == 0 and traced[i] == 0]
    step_times, comm_times, exposed_times = [], [], []
    for i in measured:
        lengths, comms, exposeds = [], [], []
        for r in range(world_size):
            window_end = intervals[i, r, 6, 1]
            lengths.append(window_end - intervals[i, r, 6, 0])
            mine = [row for row in collectives if row[0] == step_index[i] and row[1] == r]
            comm = _union([(max(row[4], 0.0), min(row[5], window_end)) for row in mine])
            waits = _union([(max(row[7], 0.0), min(row[8], window_end)) for row in mine
                            if len(row) > 7 and not math.isnan(row[7])])
            cover = _union([tuple(intervals[i, r, PHASES.index(p)])
                            for p in ("forward", "backward", "optimizer")
                            if not math.isnan(intervals[i, r, PHASES.index(p), 0])])
            comms.append(_length(comm))
            # Comm outside compute, plus comm inside compute while compute was waiting.
            hidden_by = _union([(b, e) for b, e in cover])
            inside = [(max(b1, b2), min(e1, e2)) for b1, e1 in comm for b2, e2 in hidden_by
                      if min(e1, e2) > max(b1, b2)]
            exposeds.append(_length(comm) - _intersection(comm, cover)
                            + _intersection(_union(inside), waits))
        step_times.append(max(lengths))
        comm_times.append(max(comms))
        exposed_times.append(max(exposeds))
    q1, median, q3 = np.quantile(step_times, [0.25, 0.5, 0.75])
    comm_median = float(np.median(comm_times))
    exposed_median = float(np.median(exposed_times))
    tflops = flops_per_step / median / world_size / 1e12
    return {
        "steps_measured": np.int64(len(measured)),
        "step_time_median_s": median, "step_time_q1_s": q1, "step_time_q3_s": q3,
        "tokens_per_s": float(np.median([tokens[i] for i in measured])) / median,
        "flops_per_step": float(flops_per_step), "tflops_per_gpu": tflops,
        "peak_tflops_per_gpu": peak, "peak_source": peak_source,
        "mfu": tflops / peak if not math.isnan(peak) else math.nan,
        "comm_time_median_s": comm_median, "exposed_comm_median_s": exposed_median,
        "exposed_comm_fraction": 0.0 if comm_median == 0 else exposed_median / comm_median,
        "comm_fraction_of_step": comm_median / median,
    }


def trace_records(steps, kernels):
    """Records of the same kernels in every given step: kernels are (name, category,
    duration_ns) and become (step, name, category, duration_ns)."""
    return [(step, name, category, duration) for step in steps
            for name, category, duration in kernels]


def _kind(name):
    return KERNEL_KINDS.index(name.split()[0]) if name.split()[0] in KERNEL_KINDS else 0


def write_kernel_trace(handle, ranks, window, step_time_of, measured_median):
    """/kernel_trace with ranks[r] = records (step, name, category, duration_ns) of rank r,
    laid end to end from each step's start (1 s apart) in the order given."""
    group = handle.create_group("kernel_trace")
    first, last = window
    traced_mean = float(np.mean([step_time_of(step) for step in range(first, last + 1)]))
    text = h5py.string_dtype()
    for key, value in {"category_names": KERNEL_CATEGORIES, "kind_names": KERNEL_KINDS,
                       "category_rules": ["1. memcpy or memset: memory", "2. nccl: communication"]
                       }.items():
        group.attrs.create(key, np.array(value, dtype=object), dtype=text)
    group.attrs["window_first"] = np.int64(first)
    group.attrs["window_last"] = np.int64(last)
    group.attrs["window_units"] = "step"
    group.attrs["traced_step_time_mean_s"] = traced_mean
    group.attrs["untraced_step_time_median_s"] = measured_median
    group.attrs["tracing_overhead"] = traced_mean / measured_median - 1
    group.attrs["clock"] = "synthetic: records laid end to end"
    for rank, records in enumerate(ranks):
        names = sorted({name for _, name, _, _ in records})
        cursor, starts, ends = {}, [], []
        for step, _, _, duration in records:
            begin = cursor.get(step, step * 1_000_000_000)
            starts.append(begin)
            ends.append(begin + duration)
            cursor[step] = begin + duration
        n = len(records)
        sub = group.create_group(f"rank_{rank}")
        sub.attrs["origin_ns"] = np.int64(0)
        sub.attrs["device"] = f"Synthetic GPU {rank}"
        columns = {
            "step": (np.int64, [r[0] for r in records]),
            "kind": (np.uint8, [_kind(r[1]) for r in records]),
            "category": (np.uint8, [KERNEL_CATEGORIES.index(r[2]) for r in records]),
            "name": (np.int32, [names.index(r[1]) for r in records]),
            "stream": (np.int32, [1 if r[2] == "communication" else 0 for r in records]),
            "start_ns": (np.int64, starts),
            "end_ns": (np.int64, ends),
            "bytes": (np.int64, [4096 if _kind(r[1]) else 0 for r in records]),
        }
        for name, (dtype, values) in columns.items():
            created = sub.create_dataset(name, data=np.asarray(values, dtype=dtype).reshape(n))
            if name in ("start_ns", "end_ns"):
                created.attrs["units"] = "ns"
        for name in ("grid", "block"):
            sub.create_dataset(name, data=np.ones((n, 3), dtype=np.int32))
        sub.create_dataset("names", data=np.array(names, dtype=object), dtype=text)
        sub.create_dataset("stream_names", data=np.array(STREAMS, dtype=object), dtype=text)


def write_gpu_state(group, steps, world_size, values):
    """/steps/gpu_*: values maps a dataset name to anything that broadcasts to [S, R];
    the datasets not named hold what a run without samples writes (CPU backend,
    telemetry off)."""
    unknown = set(values) - set(GPU_DATASETS)
    assert not unknown, f"not a /steps/gpu_* dataset: {sorted(unknown)}"
    for name, (dtype, units, empty) in GPU_DATASETS.items():
        data = np.broadcast_to(np.asarray(values.get(name, empty), dtype=dtype),
                               (steps, world_size))
        created = group.create_dataset(name, data=data, maxshape=(None, world_size),
                                       chunks=(1, world_size))
        if units is not None:
            created.attrs["units"] = units


def write_gpu_phase_state(group, steps, world_size, values):
    """/steps/gpu_phase_*: values maps a dataset name to anything that broadcasts to
    [S, R, P]; the datasets not named hold what a run without samples writes."""
    unknown = set(values) - set(GPU_PHASE_DATASETS)
    assert not unknown, f"not a /steps/gpu_phase_* dataset: {sorted(unknown)}"
    shape = (steps, world_size, len(PHASES))
    for name, (dtype, units, empty) in GPU_PHASE_DATASETS.items():
        data = np.broadcast_to(np.asarray(values.get(name, empty), dtype=dtype), shape)
        created = group.create_dataset(name, data=data, maxshape=(None,) + shape[1:],
                                       chunks=(1,) + shape[1:])
        if units is not None:
            created.attrs["units"] = units


def write_host_info(handle, hostnames, logical_cores, cpu_binding, cpu_model):
    """/ranks/logical_cores, /ranks/cpu_binding and /ranks/cpu_model (version 5)."""
    world_size = len(hostnames)
    if cpu_binding is None:
        local = Counter()
        cpu_binding = []
        for host in hostnames:
            cpu_binding.append(str(local[host]))
            local[host] += 1
    text = h5py.string_dtype()
    handle.create_dataset("ranks/logical_cores", data=np.broadcast_to(
        np.asarray(logical_cores, dtype=np.int64), (world_size,)))
    handle.create_dataset("ranks/cpu_binding", data=np.array(cpu_binding, dtype=object),
                          dtype=text)
    handle.create_dataset("ranks/cpu_model", data=np.array([cpu_model] * world_size,
                                                           dtype=object), dtype=text)


def write_placement(handle, hostnames, schema_version, devices, device_uuid, device_pci_bus_id):
    """/ranks/node_index and /ranks/local_rank (version 5): hosts numbered in order of
    their lowest rank, and each rank's place among its host's; and from version 7
    /ranks/device_uuid and /ranks/device_pci_bus_id (default: one GPU per rank, as
    nvidia-smi names them, on cuda; "" on the cpu)."""
    node_of_host, local = {}, Counter()
    node_index, local_rank = [], []
    for host in hostnames:
        node_index.append(node_of_host.setdefault(host, len(node_of_host)))
        local_rank.append(local[host])
        local[host] += 1
    handle.create_dataset("ranks/node_index", data=np.array(node_index, dtype=np.int64))
    handle.create_dataset("ranks/local_rank", data=np.array(local_rank, dtype=np.int64))
    if schema_version < 7:
        return
    gpu = [not str(device).startswith("cpu") for device in devices]
    if device_uuid is None:
        device_uuid = [f"GPU-{rank:08x}-0000-0000-0000-000000000000" if on_gpu else ""
                       for rank, on_gpu in enumerate(gpu)]
    if device_pci_bus_id is None:
        device_pci_bus_id = [f"00000000:{0x18 + local_rank[rank]:02X}:00.0" if on_gpu else ""
                             for rank, on_gpu in enumerate(gpu)]
    text = h5py.string_dtype()
    for name, values in (("device_uuid", device_uuid), ("device_pci_bus_id", device_pci_bus_id)):
        handle.create_dataset(f"ranks/{name}", data=np.array(values, dtype=object), dtype=text)


def step_lengths(step_times, steps, world_size):
    values = np.asarray(step_times, dtype=float)
    if values.ndim == 0:
        return np.full((steps, world_size), float(values))
    if values.ndim == 1:
        return np.repeat(values[:, None], world_size, axis=1)
    return values.copy()


def base_config(**overrides):
    config = {"experiment": "synthetic", "model": "tiny", "strategy": "ddp", "overlap": "off",
              "scaling": "strong", "global_batch": "8", "batch_per_rank": "8", "seq": "64",
              "grad_accum": "1", "steps": "6", "warmup_steps": "1", "repeat": "0",
              "precision": "fp32", "layers": "2", "hidden": "64", "heads": "4",
              "vocab": "256", "seed": "1", "output": "run.h5"}
    config.update({key: str(value) for key, value in overrides.items()})
    return config


def write_run(path, *, world_size=1, step_times=0.1, steps=6, warmup_steps=1,
              status="complete", git_sha="abc1234", config=None, tokens_per_step=None,
              flops_per_step=1e12, peak=math.nan, peak_source="none", backend="cpu",
              intervals=None, collectives=None, summary="reference", failure_reason="",
              hostnames=None, schema_version=8, traced_steps=(), kernel_trace=None,
              gpu_state=None, gpu_phase_state=None, devices=None, logical_cores=64,
              cpu_binding=None, cpu_model="Synthetic CPU @ 3.0GHz", git_dirty=None,
              loss=None, memory_bytes=None, memory_estimate_bytes=None, device_uuid=None,
              device_pci_bus_id=None, link_emulation="none", nccl_transports=None):
    """Writes one run. step_times: scalar, [S] or [S, R] step lengths; intervals and
    collectives (rows of step, rank, kind, phase, begin, end, bytes) override the default
    layout. summary: "reference" (written for complete runs), None (not written) or a
    dict to store verbatim. schema_version 1 writes no /steps/traced, versions 1 and 2
    no /steps/gpu_* and no gpu_telemetry_ms in /config, and versions 1 to 3 no
    /steps/gpu_phase_*. traced_steps: the step indices of
    the traced window; kernel_trace: per rank, records (step, name, category, duration_ns)
    for /kernel_trace (see write_kernel_trace); gpu_state: values of /steps/gpu_* (see
    write_gpu_state), all "no samples" when None; gpu_phase_state: values of
    /steps/gpu_phase_* (see write_gpu_phase_state), likewise, written from version 4.
    From version 5: /ranks/logical_cores (logical_cores: a scalar or one per rank),
    /ranks/cpu_binding (one CPU list per rank; default rank r bound to core r of its
    host), /ranks/cpu_model, /ranks/node_index and /ranks/local_rank, and, when git_dirty
    is not None, the root attribute git_dirty. From version 7: /ranks/device_uuid and
    /ranks/device_pci_bus_id (see write_placement).
    devices: one name per rank (default: the backend's name on every rank); hostnames
    default to four ranks per host, and nodes and ranks_per_node follow from them. loss:
    [S] values of /steps/loss; memory_bytes: anything that broadcasts to [R, M].
    memory_estimate_bytes: from version 6, the root attributes of the memory preflight
    (the estimate, its kinds split evenly, and twice it available), when not None.
    From version 8: link_emulation (root attribute and /config) and NCCL's transports
    (nccl_transports: one list for every rank; default "none" on the cpu or one rank,
    else "NET/Socket" emulated, "NET/IB,P2P" across hosts and "P2P" on one)."""
    assert schema_version >= 2 or not (traced_steps or kernel_trace), "v1 has no tracing"
    assert schema_version >= 3 or gpu_state is None, "the GPU state is new in v3"
    assert schema_version >= 4 or gpu_phase_state is None, "the state by phase is new in v4"
    config = dict(config or base_config())
    if schema_version >= 3:
        config.setdefault("gpu_telemetry_ms", "10" if backend == "cuda" else "0")
    else:
        config.pop("gpu_telemetry_ms", None)
    if config.get("scaling") == "weak":
        config["global_batch"] = str(int(config["batch_per_rank"]) * world_size)
    else:
        config["batch_per_rank"] = str(int(config["global_batch"]) // world_size)
    step_index = np.arange(steps, dtype=np.int64)
    warmup = (step_index < warmup_steps).astype(np.uint8)
    traced = np.isin(step_index, list(traced_steps)).astype(np.uint8)
    lengths = step_lengths(step_times, steps, world_size)
    if intervals is None:
        intervals = layout_intervals(lengths)
    if collectives is None:
        collectives = layout_collectives(lengths, step_index)
    if tokens_per_step is None:
        tokens_per_step = int(config["global_batch"]) * int(config["seq"])
    tokens = np.full(steps, tokens_per_step, dtype=np.int64)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        attrs = handle.attrs
        attrs["schema_version"] = np.int64(schema_version)
        for key, value in {"scalestudy_version": "0.1.0", "git_sha": git_sha,
                           "argv": f"scalestudy train --output {path}",
                           "start_time": "2025-01-01T00:00:00Z",
                           "end_time": "" if status == "running" else "2025-01-01T00:01:00Z",
                           "backend": backend, "precision": config["precision"],
                           "status": status, "failure_reason": failure_reason,
                           "cuda_version": "none", "nccl_version": "none",
                           "mpi_version": "synthetic MPI", "hdf5_version": "1.14.3"}.items():
            attrs[key] = value
        hostnames = hostnames or [f"node{r // 4:02d}" for r in range(world_size)]
        attrs["world_size"] = np.int64(world_size)
        attrs["nodes"] = np.int64(len(set(hostnames)))
        attrs["ranks_per_node"] = np.int64(max(Counter(hostnames).values()))
        if schema_version >= 8:
            if nccl_transports is None:
                nccl_transports = ("none" if backend == "cpu" or world_size == 1 else
                                   "NET/Socket" if link_emulation != "none" else
                                   "NET/IB,P2P" if len(set(hostnames)) > 1 else "P2P")
            attrs["link_emulation"] = link_emulation
            attrs["nccl_transports"] = nccl_transports
            attrs["nccl_environment"] = "" if link_emulation == "none" else "NCCL_NET=Socket"
            config["link_emulation"] = link_emulation
        if schema_version >= 5 and git_dirty is not None:
            attrs["git_dirty"] = np.int64(git_dirty)
        if schema_version >= 6 and memory_estimate_bytes is not None:
            attrs["memory_estimate_bytes"] = np.int64(memory_estimate_bytes)
            attrs["memory_estimate_by_kind"] = np.full(len(MEMORY_KINDS), memory_estimate_bytes // len(MEMORY_KINDS),
                                                       dtype=np.int64)
            attrs["memory_available_bytes"] = np.int64(2 * memory_estimate_bytes)
        group = handle.create_group("config")
        for key, value in config.items():
            group.attrs[key] = value
        group.attrs["config_hash"] = "0123abcd"
        text = h5py.string_dtype()
        handle.create_dataset("ranks/hostname", data=np.array(hostnames, dtype=object),
                              dtype=text)
        devices = devices or [backend] * world_size
        handle.create_dataset("ranks/device", data=np.array(devices, dtype=object), dtype=text)
        if schema_version >= 8:
            handle["ranks"].attrs["nccl_transports"] = np.array([nccl_transports] * world_size, dtype=object)
        if schema_version >= 5:
            write_host_info(handle, hostnames, logical_cores, cpu_binding, cpu_model)
            write_placement(handle, hostnames, schema_version, devices, device_uuid,
                            device_pci_bus_id)
        group = handle.create_group("steps")
        group.attrs["phase_names"] = np.array(PHASES, dtype=object)
        created = group.create_dataset("intervals", data=intervals,
                                       maxshape=(None,) + intervals.shape[1:],
                                       chunks=(1,) + intervals.shape[1:])
        created.attrs["units"] = "s"
        loss = np.linspace(5.0, 4.0, steps) if loss is None else np.asarray(loss, dtype=float)
        group.create_dataset("loss", data=loss, maxshape=(None,))
        group.create_dataset("tokens", data=tokens, maxshape=(None,)).attrs["units"] = "tokens"
        group.create_dataset("warmup", data=warmup, maxshape=(None,))
        if schema_version >= 2:
            group.create_dataset("traced", data=traced, maxshape=(None,))
        group.create_dataset("step_index", data=step_index, maxshape=(None,))
        if schema_version >= 3:
            write_gpu_state(group, steps, world_size, gpu_state or {})
        if schema_version >= 4:
            write_gpu_phase_state(group, steps, world_size, gpu_phase_state or {})
        comm_bytes = np.zeros((steps, len(COLLECTIVES)), dtype=np.int64)
        for step, rank, kind, _, _, _, payload, *_ in collectives:
            if rank == 0:
                comm_bytes[step, kind] += payload
        created = group.create_dataset("comm_bytes", data=comm_bytes,
                                       maxshape=(None, len(COLLECTIVES)))
        created.attrs["units"] = "bytes"
        created.attrs["collective_names"] = np.array(COLLECTIVES, dtype=object)

        group = handle.create_group("collectives")
        group.attrs["collective_names"] = np.array(COLLECTIVES, dtype=object)
        group.attrs["phase_names"] = np.array(PHASES, dtype=object)
        # Rows may omit the two wait columns: compute never waited for those collectives.
        rows = [tuple(row) + (math.nan, math.nan)[: 9 - len(row)] for row in collectives]
        columns = list(zip(*rows)) if rows else [[]] * 9
        dtypes = [np.int64, np.int32, np.int32, np.int32, np.float64, np.float64, np.int64,
                  np.float64, np.float64]
        names = ["step", "rank", "kind", "phase", "begin", "end", "payload_bytes",
                 "wait_begin", "wait_end"]
        for name, dtype, values in zip(names, dtypes, columns):
            created = group.create_dataset(name, data=np.asarray(values, dtype=dtype),
                                           maxshape=(None,), chunks=(1024,))
            if name in ("begin", "end", "wait_begin", "wait_end"):
                created.attrs["units"] = "s"
            if name == "payload_bytes":
                created.attrs["units"] = "bytes"

        group = handle.create_group("memory")
        memory = np.broadcast_to(np.asarray(1024 if memory_bytes is None else memory_bytes,
                                            dtype=np.int64), (world_size, len(MEMORY_KINDS)))
        created = group.create_dataset("bytes", data=memory)
        created.attrs["kind_names"] = np.array(MEMORY_KINDS, dtype=object)
        created.attrs["units"] = "bytes"
        created = group.create_dataset("peak_bytes", data=np.full(world_size, 1 << 30,
                                                                  dtype=np.int64))
        created.attrs["units"] = "bytes"
        created.attrs["peak_source"] = "VmHWM"

        if summary == "reference" and status != "complete":
            summary = None
        if summary == "reference":
            summary = reference_summary(intervals, warmup, tokens, step_index, collectives,
                                        world_size, flops_per_step, peak, peak_source, traced)
        if summary is not None:
            group = handle.create_group("summary")
            for key, value in summary.items():
                group.attrs[key] = value
        if kernel_trace is not None:
            measured = [i for i in range(steps) if not warmup[i] and not traced[i]]
            median = (float(np.median([reference_step_time(intervals, i) for i in measured]))
                      if measured else math.nan)
            write_kernel_trace(handle, kernel_trace, (min(traced_steps), max(traced_steps)),
                               lambda i: reference_step_time(intervals, i), median)
    return path


# Changes to a written run's /steps datasets, for the tests of malformed files: each
# returns a function of the open file.
def changed_file(path, change):
    """Applies change(handle) to the HDF5 file at path, in place; returns the path."""
    with h5py.File(path, "r+") as handle:
        change(handle)
    return path


def replace_steps_dataset(name, data):
    def change(handle):
        del handle[f"steps/{name}"]
        handle.create_dataset(f"steps/{name}", data=data)
    return change


def reshape_steps_dataset(name, shape):
    def change(handle):
        values = handle[f"steps/{name}"][()]
        replace_steps_dataset(name, np.resize(values, shape))(handle)
    return change


def set_steps_value(name, index, value):
    def change(handle):
        handle[f"steps/{name}"][index] = value
    return change


def drop_steps_dataset(name):
    def change(handle):
        del handle[f"steps/{name}"]
    return change
