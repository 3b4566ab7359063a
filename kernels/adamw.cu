#include "adamw.cuh"

#include <cmath>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// What every element's step shares: the hyperparameters, and the bias corrections
// computed once on the host.
struct AdamWStep {
  float learning_rate;
  float beta1;
  float beta2;
  float epsilon;
  float bias_correction1;
  float bias_correction2;
};

AdamWStep make_step(const AdamWParams& hyper) {
  SCALESTUDY_CHECK(hyper.step >= 1,
                   "adamw: step is 1-based, got " + std::to_string(hyper.step));
  // In double once on the host: beta^t for large t is where fp32 powers drift.
  return AdamWStep{hyper.learning_rate,
                   hyper.beta1,
                   hyper.beta2,
                   hyper.epsilon,
                   static_cast<float>(1.0 - std::pow(double{hyper.beta1}, hyper.step)),
                   static_cast<float>(1.0 - std::pow(double{hyper.beta2}, hyper.step))};
}

// One element's step; m and v are updated in place and the new parameter returned. The
// __f*_rn intrinsics (never fused into multiply-adds) and the IEEE-rounded sqrt and
// division reproduce the CPU's fp32 arithmetic step for step.
__device__ __forceinline__ float adamw_element(float param, float grad, float& m, float& v,
                                               const AdamWStep& s, float weight_decay) {
  const float one_minus_beta1 = 1.0f - s.beta1;
  const float one_minus_beta2 = 1.0f - s.beta2;
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(one_minus_beta1, grad));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(one_minus_beta2, grad), grad));
  const float m_hat = __fdiv_rn(m, s.bias_correction1);
  const float v_hat = __fdiv_rn(v, s.bias_correction2);
  const float direction = __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), s.epsilon)),
                                    __fmul_rn(weight_decay, param));
  return __fsub_rn(param, __fmul_rn(s.learning_rate, direction));
}

struct AdamWKernelParams {
  float* params;
  const float* grads;
  float* m;
  float* v;
  size_t elems;
  float weight_decay;
  AdamWStep step;
};

__global__ void adamw_kernel(AdamWKernelParams p) {
  for (size_t i = grid_thread_index(); i < p.elems; i += grid_threads()) {
    float m = p.m[i], v = p.v[i];
    p.params[i] = adamw_element(p.params[i], p.grads[i], m, v, p.step, p.weight_decay);
    p.m[i] = m;
    p.v[i] = v;
  }
}

// One launch for a model's ~150 tensors instead of one each (one launch a tensor costs
// more than the update's memory traffic, the small tensors' launches being mostly
// idle multiprocessors), and the 16-bit copy
// written from the registers instead of by a cast kernel that reads the parameters
// again. Each block takes one tile of one piece, found by a binary search over the
// table: a fixed assignment, so the launch shape never depends on the device.
constexpr int kPieceThreads = 256;
constexpr int kTileElemsPerThread = 8;
constexpr size_t kPieceTileElems = size_t{kPieceThreads} * kTileElemsPerThread;

template <class Copy>
struct AdamWPiecesParams {
  float* params;
  const float* grads;
  float* m;
  float* v;
  Copy* copy;  // null, or the 16-bit copy of params
  const AdamWDevicePiece* table;
  int table_pieces;
  AdamWStep step;
};

// Copy is float where there is no copy to write (copy is then null).
template <class Copy>
__global__ void __launch_bounds__(kPieceThreads) adamw_pieces_kernel(AdamWPiecesParams<Copy> p) {
  int lo = 0, hi = p.table_pieces - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.table[mid].first_block <= blockIdx.x)
      lo = mid;
    else
      hi = mid - 1;
  }
  const AdamWDevicePiece piece = p.table[lo];
  const size_t tile_begin =
      piece.begin_elems + size_t(blockIdx.x - piece.first_block) * kPieceTileElems;
  const size_t tile_end = min(tile_begin + kPieceTileElems, piece.end_elems);
  for (size_t i = tile_begin + threadIdx.x; i < tile_end; i += kPieceThreads) {
    float m = p.m[i], v = p.v[i];
    const float updated = adamw_element(p.params[i], p.grads[i], m, v, p.step, piece.weight_decay);
    p.params[i] = updated;
    p.m[i] = m;
    p.v[i] = v;
    if constexpr (!std::is_same_v<Copy, float>) p.copy[i] = from_float<Copy>(updated);
  }
}

void check_operands(const float* params, const float* grads, const float* m, const float* v) {
  check_not_null({{params, "adamw params"},
                  {grads, "adamw grads"},
                  {m, "adamw m"},
                  {v, "adamw v"}});
}

template <class Copy>
void adamw_update_pieces(cudaStream_t stream, const AdamWTensors& tensors,
                         const AdamWDeviceTable& table, const AdamWParams& hyper, Copy* copy) {
  const auto& [params, grads, m, v] = tensors;
  const AdamWStep step = make_step(hyper);
  if (table.blocks == 0) return;
  check_operands(params, grads, m, v);
  check_not_null(table.pieces, "adamw piece table");
  check_positive(table.count, "adamw table pieces");
  const AdamWPiecesParams<Copy> p{params, grads, m, v, copy, table.pieces, table.count, step};
  adamw_pieces_kernel<Copy><<<table.blocks, kPieceThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

}  // namespace

void launch_adamw_update(cudaStream_t stream, float* params, const float* grads, float* m,
                         float* v, size_t elems, const AdamWParams& hyper) {
  const AdamWStep step = make_step(hyper);
  if (elems == 0) return;
  check_operands(params, grads, m, v);
  const AdamWKernelParams p{params, grads, m, v, elems, hyper.weight_decay, step};
  adamw_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

AdamWPieceTable make_adamw_piece_table(const std::vector<AdamWPiece>& pieces) {
  AdamWPieceTable table;
  size_t blocks = 0;
  for (const AdamWPiece& piece : pieces) {
    SCALESTUDY_CHECK(piece.begin_elems <= piece.end_elems, "adamw: a piece ends before it begins");
    if (piece.begin_elems == piece.end_elems) continue;
    table.pieces.push_back(AdamWDevicePiece{piece.begin_elems, piece.end_elems,
                                            static_cast<unsigned>(blocks), piece.weight_decay});
    blocks += (piece.end_elems - piece.begin_elems + kPieceTileElems - 1) / kPieceTileElems;
    SCALESTUDY_CHECK(blocks < (size_t{1} << 31), "adamw: too many elements for one launch");
  }
  table.blocks = static_cast<unsigned>(blocks);
  return table;
}

void launch_adamw_update_pieces(cudaStream_t stream, const AdamWTensors& tensors,
                                const AdamWDeviceTable& table, const AdamWParams& hyper) {
  adamw_update_pieces<float>(stream, tensors, table, hyper, nullptr);
}

template <class Half>
void launch_adamw_update_pieces(cudaStream_t stream, const AdamWTensors& tensors,
                                const AdamWDeviceTable& table, const AdamWParams& hyper,
                                Half* copy) {
  check_not_null(copy, "adamw copy");
  adamw_update_pieces(stream, tensors, table, hyper, copy);
}

template void launch_adamw_update_pieces(cudaStream_t, const AdamWTensors&, const AdamWDeviceTable&,
                                         const AdamWParams&, bf16*);
template void launch_adamw_update_pieces(cudaStream_t, const AdamWTensors&, const AdamWDeviceTable&,
                                         const AdamWParams&, fp16*);

}  // namespace scalestudy::cuda
