#include "train/memory_preflight.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/mpi_runtime.h"
#include "control/mpi_check.h"
#include "control/control_wait.h"
#include "core/usage_error.h"
#include "model/gpt.h"
#include "model/parameter_layout.h"

namespace scalestudy {

bool rows_fit_the_ops(int micro_batch, int seq) {
  return static_cast<long long>(micro_batch) * static_cast<long long>(seq) <= INT_MAX;
}

MemoryEstimate estimate_training_memory(const TrainingMemoryInputs& in) {
  const Backend& backend = in.strategy.backend;
  MemoryEstimate estimate = plan_strategy_memory(in.strategy);
  estimate[MemoryKind::parameters] += Gpt::parameter_bytes(backend, in.strategy.plan.padded_elems);
  estimate[MemoryKind::activations] +=
      Gpt::activation_bytes(backend, in.shape, in.micro_batch, in.seq, in.recompute);
  estimate[MemoryKind::other] += backend.allocated_bytes(MemoryKind::other);
  // A micro-batch beyond the ops' rows never runs; its activations alone tell how far off it is.
  if (rows_fit_the_ops(in.micro_batch, in.seq))
    estimate[MemoryKind::other] += backend.model_scratch_bytes(in.shape, in.micro_batch, in.seq);
  return estimate;
}

namespace {

// What every rank tells the others: the bytes it still needs (with head-room) and has,
// and whether its micro-batch has rows the ops can count.
struct RankMemory {
  int64_t needed_bytes = 0;
  int64_t available_bytes = 0;
  int64_t rows_fit = 1;
  bool fits() const { return rows_fit != 0 && needed_bytes <= available_bytes; }
  // How far it is from fitting, to find the rank that the message names.
  double shortfall() const {
    return rows_fit != 0 ? static_cast<double>(needed_bytes) - static_cast<double>(available_bytes) : HUGE_VAL;
  }
};

size_t backend_held_bytes(const Backend& backend) {
  size_t held = 0;
  for (int k = 0; k < kMemoryKindCount; ++k) held += backend.allocated_bytes(static_cast<MemoryKind>(k));
  return held;
}

size_t needed_with_headroom(const MemoryEstimate& estimate, size_t held_bytes) {
  const size_t total = estimate.total_bytes();
  return memory_with_headroom(total - std::min(total, held_bytes));
}

int64_t as_int64(size_t bytes) {
  return static_cast<int64_t>(std::min<size_t>(bytes, static_cast<size_t>(INT64_MAX)));
}

// The estimates of the same run with another micro-batch split and recomputation.
class RunVariants {
 public:
  RunVariants(const RunConfig& config, const BucketPlan& plan, const Backend& backend, const Communicator& comm)
      : config_(config),
        plan_(plan),
        backend_(backend),
        comm_(comm),
        parallel_(config.data_parallel()),
        layout_(make_parameter_layout(config.shape)) {}

  MemoryEstimate estimate(int grad_accum, bool recompute) const {
    return estimate_training_memory(
        {.strategy = {parallel_, backend_, comm_, plan_, layout_, grad_accum},
         .shape = config_.shape, .micro_batch = config_.batch_per_rank / grad_accum, .seq = config_.seq,
         .recompute = recompute});
  }
  // Whether the run fits in `available_bytes` with this split and recomputation.
  bool fits(int grad_accum, bool recompute, size_t held_bytes, size_t available_bytes) const {
    if (!rows_fit_the_ops(config_.batch_per_rank / grad_accum, config_.seq)) return false;
    return needed_with_headroom(estimate(grad_accum, recompute), held_bytes) <= available_bytes;
  }
  // The fewest micro-batches (a divisor of the batch per rank, as --grad-accum must be)
  // with which the run fits, if any does.
  std::optional<int> fewest_fitting_accum(bool recompute, size_t held_bytes, size_t available_bytes) const {
    for (int grad_accum : divisors(config_.batch_per_rank))
      if (fits(grad_accum, recompute, held_bytes, available_bytes)) return grad_accum;
    return std::nullopt;
  }

 private:
  static std::vector<int> divisors(int n) {
    std::vector<int> low, high;
    for (int d = 1; static_cast<long long>(d) * d <= n; ++d) {
      if (n % d != 0) continue;
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
    low.insert(low.end(), high.rbegin(), high.rend());
    return low;
  }

  const RunConfig& config_;
  const BucketPlan& plan_;
  const Backend& backend_;
  const Communicator& comm_;
  const DataParallelConfig parallel_;
  const ParameterLayout layout_;
};

// "--global-batch 100000" or "--batch-per-rank 4": the batch option the run was given.
std::string batch_option(const RunConfig& config) {
  return config.scaling == Scaling::strong ? "--global-batch " + std::to_string(config.global_batch)
                                           : "--batch-per-rank " + std::to_string(config.batch_per_rank);
}

// What would fit instead, as options to add: recomputation alone, fewer sequences per
// micro-batch, or both; or what is left when nothing does.
std::string suggestion(const RunConfig& config, const RunVariants& variants, size_t held_bytes,
                       size_t available_bytes) {
  const std::optional<int> plain = variants.fewest_fitting_accum(config.recompute, held_bytes, available_bytes);
  std::optional<int> recomputed;
  if (!config.recompute) recomputed = variants.fewest_fitting_accum(true, held_bytes, available_bytes);
  const auto accum = [](int n) { return "--grad-accum " + std::to_string(n); };
  if (recomputed && *recomputed <= config.grad_accum)
    return "it fits with --recompute on" + (*recomputed < config.grad_accum ? " " + accum(*recomputed) : "") +
           (plain ? ", or with " + accum(*plain) : "");
  if (plain && recomputed && *recomputed < *plain)
    return "it fits with " + accum(*plain) + ", or with --recompute on " + accum(*recomputed);
  if (plain) return "it fits with " + accum(*plain);
  const int one_sequence = config.batch_per_rank;
  const MemoryEstimate smallest = variants.estimate(one_sequence, true);
  return "even one sequence per micro-batch with --recompute on (" + accum(one_sequence) + ") needs " +
         human_bytes(needed_with_headroom(smallest, held_bytes)) +
         ": a smaller model or --seq, more memory per rank, or (zero2) more ranks";
}

std::string refusal(const RunConfig& config, const MemoryPreflight& mine, const RunVariants& variants,
                    int worst_rank, const RankMemory& worst) {
  const size_t available = static_cast<size_t>(worst.available_bytes);
  const std::string rows =
      worst.rows_fit != 0 ? ""
                          : " (and a micro-batch of " + std::to_string(config.micro_batch()) + " x " +
                                std::to_string(config.seq) + " tokens is more rows than the ops count, 2^31 - 1)";
  return batch_option(config) + ": model " + config.model + " needs " +
         human_bytes(static_cast<size_t>(worst.needed_bytes)) + " per rank with head-room (" +
         mine.estimate.describe() + ")" + rows + ", and rank " + std::to_string(worst_rank) + " has " +
         human_bytes(available) + " available (" + mine.available_source + "); " +
         suggestion(config, variants, mine.held_bytes, available);
}

// This rank's share of the memory available, and where it comes from.
void find_available(const Backend& backend, MPI_Comm control, MemoryPreflight& preflight) {
  const size_t available = backend.available_bytes();
  if (backend.name() != "cpu") {
    preflight.available_bytes = available;
    preflight.available_source = "free memory of its GPU";
    return;
  }
  // Every rank of the node allocates from the same host memory at once.
  const int local_ranks = node_ranks(control).local_size;
  preflight.available_bytes = available / static_cast<size_t>(local_ranks);
  preflight.available_source = "the host's MemAvailable of " + human_bytes(available) + " shared by " +
                               std::to_string(local_ranks) + " rank" + (local_ranks == 1 ? "" : "s") +
                               " of its node";
}

}  // namespace

size_t MemoryPreflight::needed_bytes() const { return needed_with_headroom(estimate, held_bytes); }

std::string MemoryPreflight::describe() const {
  return "memory per rank: estimated " + human_bytes(estimate.total_bytes()) + " (" + estimate.describe() +
         "), " + human_bytes(needed_bytes()) + " still to allocate with head-room, of " +
         human_bytes(available_bytes) + " available (" + available_source + ")";
}

MemoryPreflight check_training_memory(const RunConfig& config, const BucketPlan& plan, const Backend& backend,
                                      const Communicator& comm, MPI_Comm control) {
  const RunVariants variants(config, plan, backend, comm);
  MemoryPreflight preflight;
  preflight.estimate = variants.estimate(config.grad_accum, config.recompute);
  preflight.held_bytes = backend_held_bytes(backend);
  find_available(backend, control, preflight);

  const RankMemory mine{as_int64(preflight.needed_bytes()), as_int64(preflight.available_bytes),
                        rows_fit_the_ops(config.micro_batch(), config.seq) ? 1 : 0};
  int world = 1;
  CHECK_MPI(MPI_Comm_size(control, &world));
  std::vector<RankMemory> ranks(static_cast<size_t>(world));
  static_assert(sizeof(RankMemory) == 3 * sizeof(int64_t), "RankMemory travels as three int64");
  control_allgather(&mine, 3, MPI_INT64_T, ranks.data(), control, "memory preflight");
  // Every rank finds the same worst rank in the same list, and refuses alike.
  size_t worst_rank = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].shortfall() > ranks[worst_rank].shortfall()) worst_rank = r;
  if (!ranks[worst_rank].fits())
    throw UsageError(refusal(config, preflight, variants, static_cast<int>(worst_rank), ranks[worst_rank]));
  return preflight;
}

}  // namespace scalestudy
