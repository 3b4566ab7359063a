"""Names and conventions of result schema v8, in one place (docs/results-schema.md)."""

SCHEMA_VERSION = 8
# Version 1 reads as version 2 with no traced steps and no /kernel_trace, versions 1 and 2
# read as version 3 without the GPUs' state, versions 1 to 3 as version 4 without the
# GPUs' state by phase, versions 1 to 4 as version 5 without the host's cores, CPU
# binding and CPU model, versions 1 to 5 as version 6 without the memory preflight's
# estimate, versions 1 to 6 as version 7 without the GPUs' UUIDs and bus ids, and
# versions 1 to 7 as version 8 without link emulation (none) and with NCCL's transports
# unknown; a comm benchmark file before version 8 reads as one of the world scope alone.
# The analysis reads all eight; anything else may mean something this code does not know.
SUPPORTED_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
# bench comm's scopes (version 8); an older file measured the world only.
COMM_SCOPES = ("world", "intra_node", "inter_node")

# Root attributes (version 8): --link-emulation ("none" or "socket"), the transports NCCL
# connected the ranks through as its log named them ("P2P", "NET/Socket,P2P"; "none"
# without connections; "unknown"), and the NCCL_* environment; per rank, the /ranks
# attribute nccl_transports.
LINK_VERSION = 8
LINK_EMULATION_ATTRIBUTE = "link_emulation"
TRANSPORTS_ATTRIBUTE = "nccl_transports"
TRANSPORTS_RANKS_ATTRIBUTE = "nccl_transports"
TRANSPORT_UNKNOWN = "unknown"
TRANSPORT_NONE = "none"

# Root attributes (version 6): the memory preflight's estimate of rank 0's memory before
# the run allocated (int64 bytes, and by kind in MEMORY_KIND_NAMES' order) and the memory
# available to rank 0 then.
MEMORY_ESTIMATE_VERSION = 6
MEMORY_ESTIMATE_ATTRIBUTE = "memory_estimate_bytes"
MEMORY_ESTIMATE_BY_KIND_ATTRIBUTE = "memory_estimate_by_kind"
MEMORY_AVAILABLE_ATTRIBUTE = "memory_available_bytes"

# /ranks (version 5): per rank, the host's logical cores (int64), the rank's CPU binding
# (a Linux CPU list, "0-3": every CPU the rank may run on) and the host's CPU model (strings).
HOST_INFO_VERSION = 5
HOST_INFO_DATASETS = ("logical_cores", "cpu_binding", "cpu_model")

# /ranks: each rank's node and local rank (versions 5 and 6: numbered from the hostnames;
# from version 7 as MPI placed the ranks, its shared-memory domains) and, from version 7,
# the GPU it drove as nvidia-smi names it ("" on the cpu backend).
PLACEMENT_VERSION = 5
PLACEMENT_DATASETS = ("node_index", "local_rank")
MPI_PLACEMENT_VERSION = 7
DEVICE_ID_VERSION = 7
DEVICE_ID_DATASETS = ("device_uuid", "device_pci_bus_id")

PHASE_NAMES = ("data", "forward", "backward", "grad-comm", "optimizer", "param-gather", "step")
PHASE = {name: index for index, name in enumerate(PHASE_NAMES)}
COMPUTE_STREAM_PHASES = ("data", "forward", "backward", "optimizer")
COMM_STREAM_PHASES = ("grad-comm", "param-gather")
# Exposed communication is comm time not hidden behind these; "data" is deliberately
# left out so that comm waiting on input loading still counts as exposed.
COVERING_PHASES = ("forward", "backward", "optimizer")

COLLECTIVE_NAMES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "barrier")
MEMORY_KIND_NAMES = ("parameters", "gradients", "optimizer", "activations", "communication",
                     "other")

STATUS_COMPLETE = "complete"
RESULT_SUFFIXES = (".h5", ".h5.partial")

# Config keys that define a series, in display order. The batch key depends on scaling.
SERIES_KEYS = ("experiment", "model", "scaling", "strategy", "overlap", "grad_accum",
               "precision", "seq")
BATCH_KEY = {"strong": "global_batch", "weak": "batch_per_rank"}

# Keys that legitimately differ between the runs of one series.
# gpu_telemetry_ms only sets how often a side thread samples the GPU, not what is
# measured, and files before version 3 lack it. overlap_after_resolved is --overlap-after
# auto bounded by 1/N for zero2: it follows the world size by design. link_emulation does
# set what is measured: it is left out here only because machine.describe puts it in every
# run's fingerprint, "none" for files before version 8, which lack it.
PER_RUN_KEYS = frozenset({"repeat", "output", "seed", "global_batch", "batch_per_rank",
                          "config_hash", "world_size", "nodes", "ranks_per_node",
                          "gpu_telemetry_ms", "overlap_after_resolved", "link_emulation"})

SUMMARY_FLOAT_KEYS = (
    "step_time_median_s", "step_time_q1_s", "step_time_q3_s", "tokens_per_s",
    "flops_per_step", "tflops_per_gpu", "peak_tflops_per_gpu", "mfu", "comm_time_median_s",
    "exposed_comm_median_s", "exposed_comm_fraction", "comm_fraction_of_step",
)
# Stored inputs to the summary rather than values derived from /steps and /collectives.
SUMMARY_INPUT_KEYS = ("flops_per_step", "peak_tflops_per_gpu", "peak_source")

SUMMARY_RTOL = 1e-6
SUMMARY_ATOL = 1e-12

# /kernel_trace (version 2). A record's category and kind index these tuples; the file
# must carry the same category list, or its indices would mean something else.
KERNEL_TRACE_GROUP = "/kernel_trace"
KERNEL_CATEGORY_NAMES = ("gemm", "attention", "norm_elementwise", "optimizer", "communication",
                         "memory", "other")
KERNEL_KIND_NAMES = ("kernel", "memcpy", "memset")
COMMUNICATION_CATEGORY = "communication"
KERNEL_RECORD_DATASETS = ("step", "kind", "category", "name", "stream", "start_ns", "end_ns",
                          "bytes")
KERNEL_LAUNCH_DATASETS = ("grid", "block")   # [N, 3]
KERNEL_TRACE_OVERHEAD_KEYS = ("traced_step_time_mean_s", "untraced_step_time_median_s",
                              "tracing_overhead")

# /steps/gpu_* (version 3): the GPUs' state per step and rank, every dataset [S, R].
GPU_STATE_VERSION = 3
GPU_SAMPLES_DATASET = "gpu_samples"                           # int64
GPU_STATE_FLOAT_DATASETS = ("gpu_sm_clock_mhz", "gpu_sm_clock_min_mhz", "gpu_power_w",
                            "gpu_temperature_c", "gpu_power_capped")   # NaN without samples
GPU_CLOCK_EVENT_REASONS_DATASET = "gpu_clock_event_reasons"   # int64, OR of the bits below
GPU_STATE_DATASETS = ((GPU_SAMPLES_DATASET,) + GPU_STATE_FLOAT_DATASETS
                      + (GPU_CLOCK_EVENT_REASONS_DATASET,))
# NVML's clock event reasons (nvmlDeviceGetCurrentClocksEventReasons), by bit.
CLOCK_EVENT_REASON_NAMES = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}

# /steps/gpu_phase_* (version 4): the same samples attributed to the phases whose intervals
# hold them, every dataset [S, R, P] with the phases in PHASE_NAMES order.
GPU_PHASE_STATE_VERSION = 4
GPU_PHASE_SAMPLES_DATASET = "gpu_phase_samples"                     # int64
GPU_PHASE_FLOAT_DATASETS = ("gpu_phase_sm_clock_mhz", "gpu_phase_power_w")    # NaN: no samples
GPU_PHASE_STATE_DATASETS = (GPU_PHASE_SAMPLES_DATASET,) + GPU_PHASE_FLOAT_DATASETS
# The phases the report shows by phase: "data" is mostly the host's wait for tokens, and
# "step" spans the whole step, which the per-step figures already give.
GPU_STATE_REPORT_PHASES = ("forward", "backward", "grad-comm", "optimizer", "param-gather")
