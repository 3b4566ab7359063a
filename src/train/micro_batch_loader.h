#pragma once
// A rank's micro-batches of tokens on the host, in the order the trainer asks for them.
// On a device, the trainer reads the next step's first micro-batch ahead (prefetch) while
// the device runs the backward it has just queued: read at the step's start, after the
// previous step's waits for the device, it left the device idle while the host read it.
#include <cstdint>
#include <vector>

#include "data/token_source.h"

namespace scalestudy {

struct MicroBatchShape {
  int rank = 0;
  int global_batch = 1;
  int batch_per_rank = 1;
  int micro_batch = 1;  // samples per micro-batch
  int seq = 1;
};

class MicroBatchLoader {
 public:
  MicroBatchLoader(const TokenSource& source, const MicroBatchShape& shape);

  // Makes inputs()/targets() micro-batch `micro_batch` of `step`: the prefetched one
  // where it is that, read now otherwise.
  void load(int step, int micro_batch);
  // Reads the first micro-batch of `step` aside, for the load() that asks for it.
  void prefetch(int step);

  const int32_t* inputs() const { return inputs_.data(); }
  const int32_t* targets() const { return targets_.data(); }

 private:
  void read(int step, int micro_batch, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;

  const TokenSource& source_;
  MicroBatchShape shape_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int32_t> next_inputs_, next_targets_;
  int prefetched_step_ = -1;  // whose first micro-batch next_inputs_ holds; -1 for none
};

}  // namespace scalestudy
