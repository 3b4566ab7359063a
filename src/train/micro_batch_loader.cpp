#include "train/micro_batch_loader.h"

#include "core/check.h"

namespace scalestudy {

MicroBatchLoader::MicroBatchLoader(const TokenSource& source, const MicroBatchShape& shape)
    : source_(source), shape_(shape) {
  SCALESTUDY_CHECK(shape.micro_batch > 0 && shape.seq > 0, "a micro-batch needs samples and tokens");
  const size_t tokens_elems = static_cast<size_t>(shape.micro_batch) * shape.seq;
  for (std::vector<int32_t>* buffer : {&inputs_, &targets_, &next_inputs_, &next_targets_})
    buffer->resize(tokens_elems);
}

void MicroBatchLoader::read(int step, int micro_batch, std::vector<int32_t>& inputs,
                            std::vector<int32_t>& targets) const {
  // Sample indices depend only on the global batch, never on the world size, so every
  // strategy at every N trains on exactly the same samples.
  const int64_t first = static_cast<int64_t>(step) * shape_.global_batch +
                        static_cast<int64_t>(shape_.rank) * shape_.batch_per_rank +
                        static_cast<int64_t>(micro_batch) * shape_.micro_batch;
  for (int i = 0; i < shape_.micro_batch; ++i) {
    const size_t at = static_cast<size_t>(i) * shape_.seq;
    source_.fill_sample(first + i, shape_.seq, inputs.data() + at, targets.data() + at);
  }
}

void MicroBatchLoader::load(int step, int micro_batch) {
  if (micro_batch == 0 && step == prefetched_step_) {
    inputs_.swap(next_inputs_);
    targets_.swap(next_targets_);
    prefetched_step_ = -1;
    return;
  }
  read(step, micro_batch, inputs_, targets_);
}

void MicroBatchLoader::prefetch(int step) {
  read(step, 0, next_inputs_, next_targets_);
  prefetched_step_ = step;
}

}  // namespace scalestudy
