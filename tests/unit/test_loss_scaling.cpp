// Dynamic loss scaling: the scaler's rule, an exact no-op when nothing overflows, and a
// skipped step when the gradients are not finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "config/run_config.h"
#include "model/gpt.h"
#include "optim/loss_scaler.h"
#include "parallel/ddp_strategy.h"
#include "train/trainer.h"
#include "cpu_training.h"
#include "train_args.h"

namespace scalestudy {
namespace {

RunConfig make_config(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", "tiny", "--seq", "16", "--batch-per-rank", "4",
                                   "--steps", "4", "--warmup-steps", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_train_options(args);
}

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterAGoodRun) {
  DynamicLossScaler scaler(true, 1024.0f, 3);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  DynamicLossScaler off(false, 1024.0f, 3);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_TRUE(off.update(false));
}

TEST(LossScaler, DefaultsFollowThePrecision) {
  EXPECT_FALSE(make_config({}).loss_scaling);
  EXPECT_TRUE(make_config({"--loss-scaling", "on"}).loss_scaling);
}

TEST(LossScaling, APowerOfTwoScaleChangesNothingWithoutOverflow) {
  // Scaling by 2^10 and unscaling by 2^-10 are exact in fp32 away from overflow and
  // underflow, so the parameters must match bit for bit.
  const std::vector<float> plain = train_on_cpu(make_config({}), MPI_COMM_SELF);
  const std::vector<float> scaled =
      train_on_cpu(make_config({"--loss-scaling", "on", "--loss-scale-init", "1024"}), MPI_COMM_SELF);
  ASSERT_EQ(plain.size(), scaled.size());
  EXPECT_EQ(count_differing(plain, scaled), 0u);
}

TEST(LossScaling, NonFiniteGradientsSkipTheUpdate) {
  const RunConfig config = make_config({"--loss-scaling", "on"});
  CpuOps ops;
  MpiCommunicator comm(MPI_COMM_SELF, 60.0);
  const ParameterLayout layout = make_parameter_layout(config.shape);
  const BucketPlan plan = make_bucket_plan(layout.param_elems, 1e9, 1);
  Gpt model(ops, config.shape, 4, 16, plan.padded_elems);
  model.initialize(1);
  DdpStrategy strategy(config.data_parallel(), ops, comm, model, plan);
  std::vector<int32_t> tokens(4 * 16, 3), targets(4 * 16, 5);
  model.forward(tokens.data(), targets.data(), &strategy);
  strategy.begin_micro_batch(0, 1);
  model.backward(strategy, 1.0f / 64);
  strategy.finish_gradient_sync();
  strategy.tensor_gradients(layout.segments[1].begin_elems)[7] = std::numeric_limits<float>::infinity();

  std::vector<float> before(layout.param_elems), after(layout.param_elems);
  ops.copy_to_host(before.data(), model.params(), before.size());
  const OptimizerStats stats = strategy.optimizer_step(1e-3f, 1, 1.0f / 65536);
  ops.copy_to_host(after.data(), model.params(), after.size());
  EXPECT_TRUE(stats.skipped);
  EXPECT_EQ(before, after);
}

}  // namespace
}  // namespace scalestudy
