#pragma once
// The one validated description of a training run. Every field is declared, documented
// and parsed in run_config.cpp; the help text comes from those same declarations.
#include <cstdint>
#include <string>
#include <vector>

#include "config/backend_config.h"
#include "config/data_parallel_config.h"
#include "config/option_groups.h"
#include "core/model_shape.h"
#include "core/precision.h"

namespace scalestudy {

enum class Scaling { strong, weak };

// --overlapped-ctas auto on cuda with overlap: of 0 (NCCL's choice), 2, 4, 8 and 16 CTAs,
// 4 gives the shortest data-parallel step with overlap. Fewer leave the collectives
// running past the backward that hides them; more take multiprocessors that the GEMMs
// beside them need.
inline constexpr int kAutoOverlappedCtas = 4;
inline constexpr int kMaxOverlappedCtas = 64;

// --overlap-after auto with overlap: on a power-capped GPU, communication beside compute
// costs clock for the whole step, since the clock follows the step's average power. Held
// until backward has finished half of the gradients, the collectives cost less clock for
// a short tail after backward, and the step is shorter than with each bucket started at
// once. zero2 on N ranks holds at most 1/N (resolve_for_world), so that the held
// gradients never exceed its shard.
inline constexpr double kAutoOverlapAfter = 0.5;

// --gpu-telemetry-ms auto on cuda: several samples in each phase of a step of tens to
// hundreds of milliseconds, at a cost too small to measure.
inline constexpr int kAutoGpuTelemetryMs = 10;
inline constexpr int kMaxGpuTelemetryMs = 1000;

struct RunConfig {
  // ---- model ------------------------------------------------------------------------
  std::string model = "tiny";  // preset name; the fields below override it
  ModelShape shape;            // resolved from the preset and the overrides
  int seq = 0;                 // tokens per sample (T); 0 = the preset's max_seq
  bool recompute = false;      // recompute each block's activations in backward

  // ---- batch and scaling ------------------------------------------------------------
  Scaling scaling = Scaling::weak;
  int global_batch = 0;        // strong scaling: samples per optimizer step, all ranks
  int batch_per_rank = 0;      // samples per optimizer step on each rank
  int grad_accum = 1;          // micro-batches per optimizer step
  int micro_batch() const { return batch_per_rank / grad_accum; }

  // ---- schedule ---------------------------------------------------------------------
  int steps = 20;
  int warmup_steps = -1;       // timed and recorded, excluded from summaries; -1: min(2, steps-1)
  float learning_rate = 6e-4f;
  float min_lr_ratio = 0.1f;   // cosine decays to learning_rate * min_lr_ratio
  int lr_warmup_steps = 0;     // linear learning-rate warm-up
  AdamWConfig adamw;           // --beta1, --beta2, --eps, --weight-decay
  float grad_clip = 1.0f;      // global-norm clipping; 0 turns it off
  bool loss_scaling = false;   // dynamic loss scaling (on by default for fp16)
  float loss_scale_init = 65536.0f;
  int loss_scale_growth_interval = 2000;

  // ---- data -------------------------------------------------------------------------
  std::string data = "random"; // random | markov | file
  std::string token_file;
  uint64_t seed = 1234;

  // ---- parallelism ------------------------------------------------------------------
  Strategy strategy = Strategy::ddp;
  bool overlap = false;
  double bucket_mb = 50.0;     // gradient bucket size, MiB of fp32
  Precision grad_reduce = Precision::fp32;  // what gradients cross ranks in: fp32 or bf16
  int overlapped_ctas = 0;     // cuda: CTAs of the overlapped buckets' NCCL kernels; 0 = NCCL's choice
  double overlap_after = 0.0;  // with overlap: share of the gradients final before any bucket starts
  bool overlap_after_auto = false;  // --overlap-after auto: resolve_for_world bounds zero2's share
  int check_every = 0;
  bool stop_on_nonfinite_loss = true;  // a step with an inf or nan loss ends the run         // replica checksum every N steps; 0 = never
  double comm_timeout_s = 300.0;
  // cuda: "none", or "socket": NCCL connects the GPUs of one host through its network
  // transport over TCP, as it connects nodes (comm/nccl_transport.h, docs/strategies.md)
  std::string link_emulation = "none";

  // ---- backend ----------------------------------------------------------------------
  std::string backend = "cpu";
  Precision precision = Precision::fp32;
  GemmAlgos gemm_algos = GemmAlgos::timed;
  // cuda 16-bit: a file of GEMM algorithms chosen for this machine, which win over
  // gemm_algos for the shapes it names (empty: none).
  std::string gemm_algos_file;
  AttentionKernel attention_kernel = AttentionKernel::auto_select;  // cuda bf16/fp16: flash or cudnn

  // ---- output -----------------------------------------------------------------------
  std::string output;          // HDF5 result file; empty = none
  bool overwrite = false;      // an existing file at output may be replaced
  int flush_every = 10;
  std::string experiment;      // provenance only
  int repeat = 0;              // provenance only
  int log_every = 1;

  // ---- kernel profile (cuda) ----------------------------------------------------------
  bool profile_kernels = false;  // CUPTI trace of steps profile_first..profile_last
  int profile_first = -1, profile_last = -1;  // resolved; -1 without a profile

  // ---- GPU state (cuda) ----------------------------------------------------------------
  int gpu_telemetry_ms = 0;    // NVML sampling period; 0 = off

  // ---- check (train --check) -----------------------------------------------------------
  bool check_only = false;     // resolve and validate for check_ranks ranks, then exit: nothing runs
  int check_ranks = 0;         // the ranks the checked run would have; 0 = not given

  // Filled in by the trainer from the communicator, not from options.
  int world_size = 1;

  // What the strategies read; resolve_for_world has bounded zero2's --overlap-after auto
  // once the world size is known.
  DataParallelConfig data_parallel() const;
  // What making the backend and its communicator reads.
  BackendConfig backend_config() const;
};

const char* scaling_name(Scaling scaling);

// Parses `scalestudy train` arguments (argv[0] is the subcommand) together with the
// optional --config INI file; the command line wins. Throws UsageError on bad input.
// Returns false when --help was printed instead.
bool parse_train_config(int argc, const char* const* argv, RunConfig& config);

// The --help text of `scalestudy train`.
std::string train_help();

// Resolves what depends on the world size: the batch (checking that the global batch
// divides), and zero2's --overlap-after auto. Throws UsageError naming the option and value.
void resolve_for_world(RunConfig& config, int world_size);

// The most bytes the result file of this resolved run takes, `buckets` gradient buckets
// per step (run_config.cpp says how the layout gives it).
double result_file_bytes_bound(const RunConfig& config, size_t buckets);
// Refuses, naming --output, a run whose output's file system has less room than
// result_file_bytes_bound; nothing without an output.
void check_output_space(const RunConfig& config, size_t buckets);

// Every resolved field as (name, value) text pairs, in declaration order: printed at
// start, stored in result files, and hashed to prove every rank runs the same config.
std::vector<std::pair<std::string, std::string>> describe_config(const RunConfig& config);
uint64_t config_hash(const RunConfig& config);

}  // namespace scalestudy
