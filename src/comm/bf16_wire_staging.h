#pragma once
// The bf16 wire of the NCCL communicator's bf16_from_f32 collectives. Each runs on one
// stream, in pieces of at most kPieceElems (per rank's chunk, for reduce-scatter): cast
// the piece to bf16 into this buffer, run the NCCL bf16 collective in place here, cast the
// result back into the fp32 destination. The stream runs one piece after another, so one
// buffer serves every collective; it grows to the largest piece asked for (the first
// step's), and bytes() reports it.
#if SCALESTUDY_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace scalestudy {

class Bf16WireStaging {
 public:
  // Elements of the largest piece a collective sends at once: 128 MiB of bf16 for an
  // allreduce, that much per rank for a reduce-scatter.
  static constexpr size_t kPieceElems = size_t(64) << 20;

  // Calls piece(offset_elems, piece_elems) over [0, elems) in pieces of at most kPieceElems.
  template <class Piece>
  static void for_each_piece(size_t elems, Piece piece) {
    for (size_t offset = 0; offset < elems; offset += kPieceElems) piece(offset, std::min(kPieceElems, elems - offset));
  }

  explicit Bf16WireStaging(cudaStream_t stream) : stream_(stream) {}
  ~Bf16WireStaging();
  Bf16WireStaging(const Bf16WireStaging&) = delete;
  Bf16WireStaging& operator=(const Bf16WireStaging&) = delete;

  // Makes room for `elems` bf16 values. On the host, before the pieces are enqueued:
  // growing waits for the stream, which may still read the old buffer.
  void reserve(size_t elems);
  // The buffer from element `offset` on.
  __nv_bfloat16* at(size_t offset = 0) const { return buffer_ + offset; }
  // Enqueued on the stream: elems values of src, rounded to bf16 (to nearest even), into
  // the buffer from `offset`; and elems values of the buffer from `offset`, widened into dst.
  void to_wire(const float* src, size_t elems, size_t offset = 0);
  void from_wire(float* dst, size_t elems, size_t offset = 0);

  size_t elems() const { return elems_; }
  size_t bytes() const { return elems_ * sizeof(__nv_bfloat16); }

 private:
  void check_range(size_t elems, size_t offset) const;

  cudaStream_t stream_;
  __nv_bfloat16* buffer_ = nullptr;
  size_t elems_ = 0;
};

}  // namespace scalestudy
#endif
