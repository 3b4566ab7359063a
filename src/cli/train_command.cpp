#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "cli/commands.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "config/run_config.h"
#include "core/check.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "train/trainer.h"

namespace scalestudy {
namespace {

// Keeps what the end-of-run summary needs.
class SummaryCollector : public StepObserver {
 public:
  void on_step(const StepRecord& record) override {
    if (losses.empty()) first_loss = record.loss;
    losses.push_back(record.loss);
    if (!record.warmup) step_times.push_back(record.intervals[static_cast<int>(Phase::step)].length());
    tokens_per_step = record.tokens;
  }
  std::vector<double> losses, step_times;
  double first_loss = 0.0;
  int64_t tokens_per_step = 0;
};

double median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void print_header(const RunConfig& c, const Trainer& trainer, const ProcessPlacement& where) {
  const ParameterLayout layout = make_parameter_layout(c.shape);
  std::printf("scalestudy train: model %s (%d layers, hidden %d, %d heads, vocab %d, %s), %zu parameters\n",
              c.model.c_str(), c.shape.layers, c.shape.channels, c.shape.heads, c.shape.vocab,
              c.shape.causal ? "causal" : "bidirectional", layout.param_elems);
  std::printf("  %d rank(s) on %d node(s), backend %s %s, strategy %s, overlap %s, %zu bucket(s) of %.2f MiB\n",
              where.world_size, where.node_count, c.backend.c_str(), precision_name(c.precision),
              strategy_name(c.strategy), c.overlap ? "on" : "off", trainer.plan().buckets.size(),
              static_cast<double>(trainer.plan().bucket_elems) * sizeof(float) / (1024.0 * 1024.0));
  std::printf("  %s scaling: global batch %d = %d rank(s) x %d, %d micro-batch(es) of %d, seq %d; data %s\n",
              scaling_name(c.scaling), c.global_batch, where.world_size, c.batch_per_rank, c.grad_accum,
              c.micro_batch(), c.seq, trainer.data().describe().c_str());
  std::printf("  %s\n", trainer.memory_summary().c_str());
  std::fflush(stdout);
}

}  // namespace

int run_train_command(int argc, const char* const* argv) {
  RunConfig config;
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  if (!parse_train_config(argc, argv, config)) {
    if (where.rank == 0) std::printf("%s", train_help().c_str());
    return 0;
  }
  if (config.backend != "cpu") throw UsageError("--backend " + config.backend + ": not available in this build");

  CpuOps ops;
  MpiCommunicator comm(MPI_COMM_WORLD, config.comm_timeout_s);
  Trainer trainer(config, ops, comm, MPI_COMM_WORLD);
  if (where.rank == 0) print_header(trainer.config(), trainer, where);

  SummaryCollector summary;
  trainer.run(&summary);

  // The job's step time is the slowest rank's.
  std::vector<double> slowest(summary.step_times.size());
  CHECK_MPI(MPI_Allreduce(summary.step_times.data(), slowest.data(), static_cast<int>(slowest.size()),
                          MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  const double peak_mib = static_cast<double>(trainer.memory().peak_bytes) / (1024.0 * 1024.0);
  double max_peak_mib = 0.0;
  CHECK_MPI(MPI_Reduce(&peak_mib, &max_peak_mib, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  if (where.rank == 0) {
    const RunConfig& c = trainer.config();
    const double step_s = median(slowest);
    const double tokens_per_s = static_cast<double>(summary.tokens_per_step) / step_s;
    const double flops = training_flops(c.shape, c.global_batch, c.seq);
    std::printf("summary: loss %.4f -> %.4f", summary.first_loss, summary.losses.back());
    if (auto entropy = trainer.data().entropy_rate_nats()) std::printf(" (source entropy rate %.4f)", *entropy);
    std::printf("\n  median step %.2f ms over %zu measured steps, %.0f tokens/s, %.3f TFLOP/s per rank\n",
                step_s * 1e3, slowest.size(), tokens_per_s, flops / step_s / where.world_size / 1e12);
    std::printf("  peak resident memory %.1f MiB (largest rank)\n", max_peak_mib);
  }
  return 0;
}

}  // namespace scalestudy
