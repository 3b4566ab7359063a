#pragma once
// AdamW steps over fp32 master weights: one contiguous range, or a range cut into pieces
// (a model's tensors) with their own weight decay, in one launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "op_params.h"

namespace scalestudy::cuda {

// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr*(m_hat/(sqrt(v_hat)+eps) + wd*p),
// with the bias corrections 1 - beta^step computed once on the host in double, and each
// per-element step rounded as the CPU backend rounds it: the results are bit-identical.
void launch_adamw_update(cudaStream_t stream, float* params, const float* grads, float* m,
                         float* v, size_t elems, const AdamWParams& hyper);

// A piece as the pieces kernel reads it: its range, its weight decay, and the first of the
// blocks that cover it, each block taking one tile of the piece.
struct AdamWDevicePiece {
  size_t begin_elems;
  size_t end_elems;
  unsigned first_block;
  float weight_decay;
};

// The device table of `pieces` (empty pieces left out) and the blocks its launch takes.
struct AdamWPieceTable {
  std::vector<AdamWDevicePiece> pieces;
  unsigned blocks = 0;
};
AdamWPieceTable make_adamw_piece_table(const std::vector<AdamWPiece>& pieces);

// A piece table on the device: `count` entries of make_adamw_piece_table's, and the
// blocks its launch takes.
struct AdamWDeviceTable {
  const AdamWDevicePiece* pieces = nullptr;
  int count = 0;
  unsigned blocks = 0;
};

// The step of launch_adamw_update, element for element, over every piece of `table` in
// one launch, hyper's weight_decay replaced by each piece's.
void launch_adamw_update_pieces(cudaStream_t stream, const AdamWTensors& tensors,
                                const AdamWDeviceTable& table, const AdamWParams& hyper);
// The same, with each updated parameter also written into the 16-bit `copy` (the
// parameters' compute copy at params' offset), rounded as launch_cast rounds it. Half is
// __nv_bfloat16 or __half.
template <class Half>
void launch_adamw_update_pieces(cudaStream_t stream, const AdamWTensors& tensors,
                                const AdamWDeviceTable& table, const AdamWParams& hyper,
                                Half* copy);

}  // namespace scalestudy::cuda
