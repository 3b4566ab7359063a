#pragma once
// The FLOP and byte models of the benchmarks, and the memory a point will allocate.
//
// FLOPs follow src/model/flops.h (the seed notebook's accounting): a multiply-add is two
// FLOPs, elementwise work (LayerNorm, GELU, softmax, residual adds) is not counted, and a
// backward pass is twice its forward.
//
// Bytes are the traffic of the op interface (src/backend/ops.h) as the backends run it,
// one kernel per op: every tensor an op reads is read once, every tensor it writes is
// written once, and a tensor it accumulates into (+=) is read and written. Traffic
// inside an op (attention's score matrix before the softmax, cuBLAS tiles, backward
// scratch) is not counted, nor are the host-to-device copies of the token ids. So this is
// the least traffic the model's op sequence needs, and FLOPs / bytes is the arithmetic
// intensity at which the roofline places each point. The MLP's GELU counts as part of the
// dense layers around it (dense_gelu_forward, dense_backward_through_gelu), as the CUDA
// backend runs it in 16 bits; backends that run those ops as the plain ones move more.
// Tensors are fp32 (kActivationBytes); token ids int32.
//
// analysis/scalestudy_analysis/bench.py holds the same model for the training phases of
// run files; its tests compare the two on files written by this binary.
#include <cstddef>

#include "backend/backend.h"
#include "core/model_shape.h"

namespace scalestudy::bench_model {

inline constexpr double kActivationBytes = 4.0;  // fp32 tensors
inline constexpr double kTokenBytes = 4.0;       // int32 token ids

// ---- bytes of one call of each op -----------------------------------------------------
double embedding_forward_bytes(double batch, double seq, double channels);
double embedding_backward_bytes(double batch, double seq, double channels);
double layernorm_forward_bytes(double rows, double channels);
// The backward ops' input gradient is read and written where it accumulates, only
// written where it is overwritten (GradientWrite in backend/ops.h).
double layernorm_backward_bytes(double rows, double channels, bool accumulate_dinp);
double matmul_forward_bytes(double rows, double in_channels, double out_channels, bool bias);
double matmul_backward_bytes(double rows, double in_channels, double out_channels, bool bias,
                             bool accumulate_dinp);
double attention_forward_bytes(double batch, double seq, double channels, double heads);
double attention_backward_bytes(double batch, double seq, double channels, double heads,
                                bool accumulate_dqkv);
double gelu_forward_bytes(double elems);
double gelu_backward_bytes(double elems, bool accumulate_dinp);
// The dense layer with the GELU after it, and the backward through that GELU of the
// dense layer that follows it (Ops::dense_gelu_forward, Ops::dense_backward_through_gelu;
// in_channels and out_channels are each op's own dense layer's).
double dense_gelu_forward_bytes(double rows, double in_channels, double out_channels);
double dense_backward_through_gelu_bytes(double rows, double in_channels, double out_channels);
double residual_add_bytes(double elems);
double accumulate_bytes(double elems);
double fill_zero_bytes(double elems);
double softmax_cross_entropy_forward_bytes(double rows, double vocab);
double softmax_cross_entropy_backward_bytes(double rows, double vocab);

// ---- the model (the op sequence of src/model/gpt.cpp) -----------------------------------
double gpt_forward_bytes(const ModelShape& shape, double batch, double seq);
double gpt_backward_bytes(const ModelShape& shape, double batch, double seq);

// ---- the parts of one block that `bench layer` times on their own ----------------------
enum class Part { ffn_dense, ffn_dense_gelu, ffn, attention, attention_core };
inline constexpr Part kParts[] = {Part::ffn_dense, Part::ffn_dense_gelu, Part::ffn, Part::attention,
                                  Part::attention_core};
const char* part_name(Part part);
// What the part runs, in words (written into the result file).
const char* part_description(Part part);
double part_forward_flops(Part part, const ModelShape& shape, double batch, double seq);
double part_forward_bytes(Part part, const ModelShape& shape, double batch, double seq);
double part_backward_bytes(Part part, const ModelShape& shape, double batch, double seq);

// ---- GEMM and elementwise ---------------------------------------------------------------
inline double gemm_flops(double n) { return 2.0 * n * n * n; }
// A and B read, C written, each n×n of `element_bytes`.
inline double gemm_bytes(double n, double element_bytes) { return 3.0 * n * n * element_bytes; }

// ---- memory a point allocates ------------------------------------------------------------
// Everything scalestudy::Gpt allocates on `backend` for a micro-batch (its parameters and
// activations, as Gpt counts them), plus, when backward runs, a gradient buffer and the
// most scratch the backend's ops hold.
size_t gpt_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq, bool backward);

}  // namespace scalestudy::bench_model
