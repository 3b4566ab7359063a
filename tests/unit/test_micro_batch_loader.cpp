// The trainer's micro-batches: whatever it read ahead, load(step, m) gives exactly the
// samples that step and micro-batch cover on this rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/random_tokens.h"
#include "train/micro_batch_loader.h"

namespace scalestudy {
namespace {

constexpr int kSeq = 8;
const MicroBatchShape kShape{/*rank=*/1, /*global_batch=*/8, /*batch_per_rank=*/4, /*micro_batch=*/2, kSeq};

// The samples of (step, micro_batch) straight from the source, inputs then targets.
std::vector<int32_t> expected(const TokenSource& source, int step, int micro_batch) {
  const int64_t first = int64_t{step} * kShape.global_batch + int64_t{kShape.rank} * kShape.batch_per_rank +
                        int64_t{micro_batch} * kShape.micro_batch;
  const size_t elems = static_cast<size_t>(kShape.micro_batch) * kSeq;
  std::vector<int32_t> tokens(2 * elems);
  for (int i = 0; i < kShape.micro_batch; ++i)
    source.fill_sample(first + i, kSeq, tokens.data() + i * kSeq, tokens.data() + elems + i * kSeq);
  return tokens;
}

std::vector<int32_t> loaded(const MicroBatchLoader& loader) {
  const size_t elems = static_cast<size_t>(kShape.micro_batch) * kSeq;
  std::vector<int32_t> tokens(loader.inputs(), loader.inputs() + elems);
  tokens.insert(tokens.end(), loader.targets(), loader.targets() + elems);
  return tokens;
}

TEST(MicroBatchLoader, GivesEachStepItsOwnSamplesWhateverWasReadAhead) {
  const RandomTokens source(50, 7);
  MicroBatchLoader loader(source, kShape);
  struct Load {
    int step, micro_batch, prefetch_after;  // prefetch_after: the step read ahead, -1 none
  };
  // In order with read-ahead, then a read-ahead that is not used (step 3 skipped), a
  // load of a step read ahead but of its second micro-batch, and one never read ahead.
  const std::vector<Load> loads = {{0, 0, -1}, {0, 1, 1}, {1, 0, -1}, {1, 1, 2}, {2, 0, -1},
                                   {2, 1, 3}, {4, 0, 5}, {5, 1, -1}, {5, 0, -1}, {3, 0, -1}};
  for (const Load& load : loads) {
    loader.load(load.step, load.micro_batch);
    EXPECT_EQ(loaded(loader), expected(source, load.step, load.micro_batch))
        << "step " << load.step << ", micro-batch " << load.micro_batch;
    if (load.prefetch_after >= 0) loader.prefetch(load.prefetch_after);
  }
}

}  // namespace
}  // namespace scalestudy
