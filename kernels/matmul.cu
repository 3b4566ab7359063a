#include "matmul.cuh"

#include <algorithm>
#include <initializer_list>

#include "common.cuh"
#include "elementwise.cuh"
#include "gemm.cuh"
#include "gemm_lt.cuh"
#include "precision.cuh"
#include "reductions.cuh"

namespace scalestudy::cuda {
namespace {

// out[n, o] += bias[o], in fp32 and rounded once to T; the bias is T too (in 16 bits, the
// parameters' copy). Addition commutes exactly, so in fp32 this rounds as the CPU's
// bias + dot does. Packs never straddle a row: they are used only when out_channels is a
// multiple of the pack.
template <class T>
__global__ void add_bias_kernel(T* __restrict__ out, const T* __restrict__ bias, int rows,
                                int out_channels, size_t packs) {
  for_each_pack_then_element<T>(
      size_t(rows) * out_channels, packs,
      [&](size_t i) {
        Pack<T> values = load_pack(out + i);
        const int column = static_cast<int>(i % out_channels);
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k)
          values.set(k, values.get(k) + to_float(bias[column + k]));
        store_pack(out + i, values);
      },
      [&](size_t i) {
        out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % out_channels]));
      });
}

// ---- 16-bit rows that cuBLAS's fast kernels cannot take -------------------------------
// A bf16 GEMM whose output rows are not a multiple of 8 elements (16 bytes) - the tied LM
// head, V = 50257 - falls off cuBLAS's fast kernels: the LM head's forward and input
// gradient then run several times slower than aligned GEMMs of their size, whatever the
// leading dimension, as long as the GEMM's m or k is V itself. So those GEMMs run on a
// copy with rows padded to a multiple of 8 (in scratch), split into an aligned main part
// (the first V0 = V rounded down to 8 columns) and a narrow tail GEMM for the last V - V0
// columns, so that nothing reads weights or activations beyond the real ones. fp16 has the same 2-byte elements
// and the same alignment rules, and takes the same path.
constexpr int kAlignedColumns = 8;

int rounded_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

int padded_columns_of(int columns) { return rounded_up(columns, kAlignedColumns); }

bool needs_padding(int columns) { return columns % kAlignedColumns != 0; }

// The logits' rows, and augmented rows, start on 128-byte lines: 64 16-bit elements. With
// rows only 8 apart (16 bytes), most rows of GPT-2's 50264 began 48 bytes into a line, so
// that every 128-byte slice of a row that the LM head's GEMMs and the cross-entropy read or
// write touched five lines instead of four.
constexpr int kRowLineElems = 64;

// One 16-byte pack of a flat [rows, columns] range (flat, so packs cross row ends): its
// elements [first, first + count) of the range (count is the pack's but in the last one),
// and (row, column), where the next of them lies in the rows.
struct FlatPack {
  size_t first;
  size_t row;
  int column;
  int count;
  // Moves (row, column) on to the next element.
  __device__ __forceinline__ void step(int columns) {
    if (++column == columns) {
      column = 0;
      ++row;
    }
  }
};

// Calls at_pack(FlatPack) for each pack of T of a flat [rows, columns] range, one a thread
// in a grid-stride loop.
template <class T, class AtPack>
__device__ __forceinline__ void for_each_flat_pack(int rows, int columns, AtPack at_pack) {
  constexpr int kCount = Pack<T>::kCount;
  const size_t elems = size_t(rows) * columns, packs = (elems + kCount - 1) / kCount;
  for (size_t p = grid_thread_index(); p < packs; p += grid_threads()) {
    const size_t first = p * kCount;
    const size_t row = first / columns;
    at_pack(FlatPack{first, row, static_cast<int>(first - row * columns),
                     static_cast<int>(min(size_t{kCount}, elems - first))});
  }
}

// out[r, c] = padded[r, c] + bias[c] (bias may be null) for c < columns: one 16-byte pack
// of out per thread, read from the padded rows. T is bf16 or fp16.
template <class T>
__global__ void unpad_rows_kernel(T* __restrict__ out, const T* __restrict__ padded,
                                  const T* __restrict__ bias, int rows, int columns,
                                  int padded_columns) {
  for_each_flat_pack<T>(rows, columns, [&](FlatPack at) {
    const size_t first = at.first;
    Pack<T> values;
    for (int k = 0; k < at.count; ++k) {
      const float value = to_float(padded[at.row * padded_columns + at.column]);
      values.set(k, bias != nullptr ? value + to_float(bias[at.column]) : value);
      at.step(columns);
    }
    if (at.count == Pack<T>::kCount) {
      store_pack(out + first, values);
    } else {
      for (int k = 0; k < at.count; ++k) out[first + k] = values.values[k];
    }
  });
}

// padded[r, c] = inp[r, c] for c < columns; the padding columns are never read.
template <class T>
__global__ void pad_rows_kernel(T* __restrict__ padded, const T* __restrict__ inp, int rows,
                                int columns, int padded_columns) {
  for_each_flat_pack<T>(rows, columns, [&](FlatPack at) {
    const size_t first = at.first;
    Pack<T> values;
    if (at.count == Pack<T>::kCount) {
      values = load_pack(inp + first);
    } else {
      for (int k = 0; k < at.count; ++k) values.values[k] = inp[first + k];
    }
    for (int k = 0; k < at.count; ++k) {
      padded[at.row * padded_columns + at.column] = values.values[k];
      at.step(columns);
    }
  });
}

// Both 16-bit types have 8 elements to a pack.
constexpr int kPack16 = 8;
static_assert(Pack<bf16>::kCount == kPack16 && Pack<fp16>::kCount == kPack16);

int pack_blocks(int rows, int columns) {
  return elementwise_blocks((size_t(rows) * columns + kPack16 - 1) / kPack16);
}

// Floats of scratch that hold rows padded to a multiple of 8 16-bit values (an even count).
size_t padded_rows_floats(int rows, int columns) {
  return size_t(rows) * padded_columns_of(columns) / 2;
}

float dinp_beta(bool accumulate_dinp) { return accumulate_dinp ? 1.0f : 0.0f; }
bool accumulates(GradientWrite dinp_write) { return dinp_write == GradientWrite::accumulate; }

void check_shape(int rows, int in_channels, int out_channels) {
  check_positive(rows, "matmul rows");
  check_positive(in_channels, "matmul in_channels");
  check_positive(out_channels, "matmul out_channels");
}

// What every GEMM path checks before it launches anything: the shape, the named operands
// (none null) and the cuBLAS handle bound to the stream.
void check_operands(const Blas& blas, cudaStream_t stream, int rows, int in_channels,
                    int out_channels, std::initializer_list<NamedOperand> operands) {
  check_shape(rows, in_channels, out_channels);
  check_not_null(operands);
  check_handle_stream(blas.handle, stream);
}

// GPT-2 small at batch 64 faulted with an illegal address in the LM head's forward GEMM,
// whose output there is 65536 rows of 50264, 3.3e9 elements; every other GEMM operand of
// the step stays below 2^31 elements. So the layers run their GEMMs on chunks of rows
// that keep every operand below 2^31 elements. A weight gradient then sums over the
// chunks one after another: a fixed order, still deterministic.
template <class F>
void for_each_row_chunk(int rows, int in_channels, int out_row_elems, F run_rows) {
  constexpr long long kMaxGemmOperandElems = (1LL << 31) - 1;
  const long long widest = std::max(in_channels, out_row_elems);
  const int chunk = static_cast<int>(std::max(1LL, kMaxGemmOperandElems / widest));
  for (int first = 0; first < rows; first += chunk) run_rows(first, std::min(chunk, rows - first));
}

// A dense layer's chunks: its output's rows are at most padded to a multiple of 8.
template <class Args, class F>
void for_each_layer_row_chunk(const Args& args, F run_rows) {
  for_each_row_chunk(args.rows, row_stride(args.inp_stride, args.in_channels),
                     padded_columns_of(args.out_channels), run_rows);
}

// Where the GEMM cannot add the residual, it writes out before the add reads the residual.
template <class T>
void check_residual_apart(const MatmulForwardArgs<T>& args) {
  SCALESTUDY_CHECK(args.residual == nullptr || args.residual != args.out,
                   "matmul forward: the residual may not be out itself");
}

// out += residual, where the GEMM that wrote out could not add the residual itself: the
// layer's result is rounded to T before the add, as a separate residual add rounds it.
template <class T>
void add_residual(cudaStream_t stream, const MatmulForwardArgs<T>& args) {
  if (args.residual != nullptr)
    launch_accumulate(stream, args.out, args.residual, size_t(args.rows) * args.out_channels);
}

// Column-major view (see gemm.cuh): out^T[OC, N] = W[OC, IC] · inp^T[IC, N].
// weight, row-major [OC, IC], is to cuBLAS W^T [IC, OC] with ld IC: op T gives W.
// inp, row-major [N, IC], is inp^T [IC, N] with ld IC: op N.
// out, row-major [N, OC], is out^T [OC, N] with ld OC.
// With a bias_gemm (16-bit only), the bias goes into cuBLASLt's epilogue where it can.
template <class T>
void matmul_forward(const Blas& blas, cudaStream_t stream, const MatmulForwardArgs<T>& args,
                    LtGemm* bias_gemm = nullptr) {
  const auto& [out, inp, weight, bias, rows, in_channels, out_channels, inp_stride, residual] = args;
  check_operands(blas, stream, rows, in_channels, out_channels,
                 {{out, "matmul out"}, {inp, "matmul inp"}, {weight, "matmul weight"}});
  check_row_stride(inp_stride, in_channels, "matmul inp");
  if (bias != nullptr && bias_gemm != nullptr &&
      bias_gemm->forward(stream, GemmTypesOf<T>::same.ab,
                         {out, inp, weight, bias, rows, in_channels, out_channels, inp_stride, residual}))
    return;
  gemm(blas, {GemmTypesOf<T>::same, CUBLAS_OP_T, CUBLAS_OP_N, out_channels, rows, in_channels,
                1.0f, {weight, in_channels}, {inp, row_stride(inp_stride, in_channels)}, 0.0f,
                {out, out_channels}});
  if (bias != nullptr) {
    const size_t elems = size_t(rows) * out_channels;
    const size_t packs =
        pack_count<T>(elems, aligned16(out) && out_channels % Pack<T>::kCount == 0);
    add_bias_kernel<T><<<packed_blocks<T>(elems, packs), kElementwiseThreads, 0, stream>>>(
        out, bias, rows, out_channels, packs);
    CHECK_LAUNCH();
  }
  add_residual(stream, args);
}

// dweight[o, i] += result[o, i] for i < IC and dbias[o] += result[o, IC]: the weight
// gradient over augmented rows, [OC, IC + kAugmentedColumns], split into the layer's two.
// One block a row o, so that no thread divides to find its row.
__global__ void split_augmented_gradient_kernel(float* __restrict__ dweight,
                                                float* __restrict__ dbias,
                                                const float* __restrict__ result, int in_channels) {
  const size_t o = blockIdx.x;
  const float* result_row = result + o * (in_channels + kAugmentedColumns);
  float* dweight_row = dweight + o * in_channels;
  for (int i = threadIdx.x; i < in_channels; i += blockDim.x) dweight_row[i] += result_row[i];
  if (threadIdx.x == 0) dbias[o] += result_row[in_channels];
}

// dweight^T and dbias^T together, [IC + kAugmentedColumns, OC] = inp_aug^T[IC + 8, N] ·
// dout[N, OC], into scratch (beta = 0), then added to the two gradients: row IC of inp_aug^T
// is all ones, so its row of the result is dout's column sums, in fp32 as the GEMM sums.
template <class T>
void augmented_parameter_gradients(const Blas& blas, cudaStream_t stream,
                                   const MatmulBackwardArgs<T>& args, Scratch scratch) {
  const int rows = args.rows, in_channels = args.in_channels, out_channels = args.out_channels;
  const int result_rows = in_channels + kAugmentedColumns;
  SCALESTUDY_CHECK(!needs_padding(out_channels),
                   "matmul backward: augmented rows need out_channels a multiple of 8");
  SCALESTUDY_CHECK(scratch.elems >= augmented_weight_gradient_elems(in_channels, out_channels),
                   "matmul backward: scratch too small for the augmented weight gradient");
  gemm(blas, {GemmTypesOf<T>::to_fp32, CUBLAS_OP_N, CUBLAS_OP_T, result_rows, out_channels, rows,
                1.0f, {args.inp, args.inp_stride}, {args.dout, out_channels}, 0.0f,
                {scratch.data, result_rows}});
  split_augmented_gradient_kernel<<<out_channels, kElementwiseThreads, 0, stream>>>(
      args.dweight, args.dbias, scratch.data, in_channels);
  CHECK_LAUNCH();
}

// The weight gradient's GEMM runs with beta = 1, which is what makes it accumulate; the
// input gradient's with beta = 1 or, to overwrite, beta = 0 (cuBLAS then never reads C).
// dinp^T[IC, N] += W^T[IC, OC] · dout^T[OC, N]: weight is W^T with ld IC (op N), dout is
//   dout^T with ld OC (op N), dinp is dinp^T with ld IC.
// dweight^T[IC, OC] += inp^T[IC, N] · dout[N, OC]: inp is inp^T with ld IC (op N), dout
//   is dout^T with ld OC (op T gives dout), dweight is dweight^T with ld IC.
// Reads dweight, dbias, dout, inp and the shape of args.
template <class T>
void matmul_parameter_gradients(const Blas& blas, cudaStream_t stream,
                                const MatmulBackwardArgs<T>& args, Scratch scratch) {
  const int rows = args.rows, in_channels = args.in_channels, out_channels = args.out_channels;
  check_row_stride(args.inp_stride, in_channels, "matmul inp");
  if (args.dbias != nullptr && args.inp_stride != 0) {
    augmented_parameter_gradients(blas, stream, args, scratch);
    return;
  }
  gemm(blas, {GemmTypesOf<T>::to_fp32, CUBLAS_OP_N, CUBLAS_OP_T, in_channels, out_channels, rows,
                1.0f, {args.inp, row_stride(args.inp_stride, in_channels)},
                {args.dout, out_channels}, 1.0f, {args.dweight, in_channels}});
  if (args.dbias != nullptr) {
    SCALESTUDY_CHECK(scratch.elems >= matmul_backward_scratch_elems(rows, out_channels),
                     "matmul backward: scratch too small");
    launch_column_sums(stream, args.dbias, args.dout, rows, out_channels, scratch.data,
                       scratch.elems);
  }
}

template <class T>
void matmul_backward(const Blas& blas, cudaStream_t stream, const MatmulBackwardArgs<T>& args,
                     Scratch scratch) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, rows, in_channels, out_channels,
               dinp_write, inp_stride] = args;
  check_operands(blas, stream, rows, in_channels, out_channels,
                 {{dinp, "matmul dinp"}, {dweight, "matmul dweight"}, {dout, "matmul dout"},
                  {inp, "matmul inp"}, {weight, "matmul weight"}});
  gemm(blas, {GemmTypesOf<T>::same, CUBLAS_OP_N, CUBLAS_OP_N, in_channels, rows, out_channels,
                1.0f, {weight, in_channels}, {dout, out_channels}, dinp_beta(accumulates(dinp_write)),
                {dinp, in_channels}});
  matmul_parameter_gradients(blas, stream, args, scratch);
}

size_t matmul_forward_scratch_elems_padded(int rows, int out_channels) {
  return needs_padding(out_channels) ? padded_rows_floats(rows, out_channels) : 0;
}

size_t matmul_backward_scratch_elems_padded(int rows, int out_channels) {
  return (needs_padding(out_channels) ? padded_rows_floats(rows, out_channels) : 0) +
         matmul_backward_scratch_elems(rows, out_channels);
}

// out^T[OC, N] into rows of out_stride elements (ld out_stride, a multiple of 8 >= OC), as
// two GEMMs: W's first OC0 rows, then its last OC - OC0 rows. Columns OC.. of each row
// are not written, and no bias is added.
template <class T>
void matmul_forward_strided(const Blas& blas, const MatmulForwardArgs<T>& args,
                            int out_stride) {
  const auto& [out, inp, weight, bias, rows, in_channels, out_channels, inp_stride, residual] = args;
  const GemmTypes types = GemmTypesOf<T>::same;
  const int aligned_channels = out_channels / kAlignedColumns * kAlignedColumns;
  if (aligned_channels > 0)
    gemm(blas, {types, CUBLAS_OP_T, CUBLAS_OP_N, aligned_channels, rows, in_channels, 1.0f,
                  {weight, in_channels}, {inp, in_channels}, 0.0f, {out, out_stride}});
  if (aligned_channels < out_channels)
    gemm(blas, {types, CUBLAS_OP_T, CUBLAS_OP_N, out_channels - aligned_channels, rows,
                  in_channels, 1.0f, {weight + size_t(aligned_channels) * in_channels, in_channels},
                  {inp, in_channels}, 0.0f, {out + aligned_channels, out_stride}});
}

// The backward's GEMMs from dout rows of dout_stride elements (a multiple of 8 >= OC, or
// OC itself). dinp takes two GEMMs (the first OC0 columns of dout with W's first OC0 rows,
// then the rest), so it is rounded to T twice. As one GEMM over all n = OC = 50257 columns
// of dout, cuBLAS runs the LM head's weight gradient on an sm_80 kernel, much slower than
// the forward's aligned GEMM of the same size, which takes a Hopper kernel.
// Reads dinp, dout, weight, the shape and dinp_write of args.
template <class T>
void input_gradient_strided(const Blas& blas, const MatmulBackwardArgs<T>& args,
                            int dout_stride) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, rows, in_channels, out_channels,
               dinp_write, inp_stride] = args;
  const GemmTypes types = GemmTypesOf<T>::same;
  const int aligned_channels = out_channels / kAlignedColumns * kAlignedColumns;
  if (aligned_channels > 0)
    gemm(blas, {types, CUBLAS_OP_N, CUBLAS_OP_N, in_channels, rows, aligned_channels, 1.0f,
                  {weight, in_channels}, {dout, dout_stride}, dinp_beta(accumulates(dinp_write)),
                  {dinp, in_channels}});
  // The tail adds to the main part's result, or starts dinp where there is no main part.
  const bool tail_accumulates = accumulates(dinp_write) || aligned_channels > 0;
  if (aligned_channels < out_channels)
    gemm(blas, {types, CUBLAS_OP_N, CUBLAS_OP_N, in_channels, rows,
                  out_channels - aligned_channels, 1.0f,
                  {weight + size_t(aligned_channels) * in_channels, in_channels},
                  {dout + aligned_channels, dout_stride}, dinp_beta(tail_accumulates),
                  {dinp, in_channels}});
}

// dweight's rows [vocab_begin, vocab_end) += dlogits[:, those columns]^T @ inp, the weight
// gradient of any dense layer without its bias (vocab = out_channels, channels =
// in_channels), split like the input gradient at OC0: each element still comes from one
// GEMM, whatever the range. dweight points at row 0; vocab_begin is a multiple of 8
// (16-byte aligned 16-bit columns).
template <class T>
void weight_gradient_strided(const Blas& blas, const ClassifierWeightGradientArgs<T>& args,
                             int dout_stride) {
  float* const dweight = args.dweight;
  const T* const dout = args.dlogits;
  const T* const inp = args.inp;
  const int rows = args.rows, in_channels = args.channels, out_channels = args.vocab;
  const int column_begin = args.vocab_begin, column_end = args.vocab_end;
  SCALESTUDY_CHECK(column_begin >= 0 && column_begin < column_end && column_end <= out_channels &&
                       column_begin % kAlignedColumns == 0,
                   "weight gradient: columns must be a non-empty range from a multiple of 8");
  const GemmTypes weight_types = GemmTypesOf<T>::to_fp32;
  const int aligned_channels = out_channels / kAlignedColumns * kAlignedColumns;
  auto columns = [&](int begin, int end) {
    if (begin < end)
      gemm(blas, {weight_types, CUBLAS_OP_N, CUBLAS_OP_T, in_channels, end - begin, rows, 1.0f,
                    {inp, in_channels}, {dout + begin, dout_stride}, 1.0f,
                    {dweight + size_t(begin) * in_channels, in_channels}});
  };
  columns(column_begin, std::min(column_end, aligned_channels));
  columns(std::max(column_begin, aligned_channels), column_end);
}

// The 16-bit forward, T = bf16 or fp16. With padding: out^T[OC, N] is computed into
// padded^T[OCp, N] (ld OCp), then copied (adding the bias) into out.
template <class T>
void matmul_forward_16bit(const Blas& blas, cudaStream_t stream,
                          const MatmulForwardArgs<T>& args, Scratch scratch,
                          LtGemm* bias_gemm) {
  const auto& [out, inp, weight, bias, rows, in_channels, out_channels, inp_stride, residual] = args;
  if (!needs_padding(out_channels)) {
    matmul_forward(blas, stream, args, bias_gemm);
    return;
  }
  SCALESTUDY_CHECK(inp_stride == 0, "matmul forward: augmented rows need out_channels a multiple of 8");
  check_operands(blas, stream, rows, in_channels, out_channels,
                 {{out, "matmul out"}, {inp, "matmul inp"}, {weight, "matmul weight"},
                  {scratch.data, "matmul scratch"}});
  SCALESTUDY_CHECK(scratch.elems >= matmul_forward_scratch_elems_padded(rows, out_channels),
                   "matmul forward: scratch too small");
  const int padded_channels = padded_columns_of(out_channels);
  auto* padded = reinterpret_cast<T*>(scratch.data);
  matmul_forward_strided(
      blas, MatmulForwardArgs<T>{padded, inp, weight, nullptr, rows, in_channels, out_channels},
      padded_channels);
  unpad_rows_kernel<T><<<pack_blocks(rows, out_channels), kElementwiseThreads, 0, stream>>>(
      out, padded, bias, rows, out_channels, padded_channels);
  CHECK_LAUNCH();
  add_residual(stream, args);
}

// The 16-bit backward. With padding, dout is first copied into padded rows (ld OCp) in
// scratch; the bias partials follow the padded rows there.
template <class T>
void matmul_backward_16bit(const Blas& blas, cudaStream_t stream,
                           const MatmulBackwardArgs<T>& args, Scratch scratch) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, rows, in_channels, out_channels,
               dinp_write, inp_stride] = args;
  if (!needs_padding(out_channels)) {
    matmul_backward(blas, stream, args, scratch);
    return;
  }
  SCALESTUDY_CHECK(inp_stride == 0, "matmul backward: augmented rows need out_channels a multiple of 8");
  check_operands(blas, stream, rows, in_channels, out_channels,
                 {{dinp, "matmul dinp"}, {dweight, "matmul dweight"}, {dout, "matmul dout"},
                  {inp, "matmul inp"}, {weight, "matmul weight"}, {scratch.data, "matmul scratch"}});
  SCALESTUDY_CHECK(scratch.elems >= matmul_backward_scratch_elems_padded(rows, out_channels),
                   "matmul backward: scratch too small");
  const int padded_channels = padded_columns_of(out_channels);
  auto* padded = reinterpret_cast<T*>(scratch.data);
  pad_rows_kernel<T><<<pack_blocks(rows, out_channels), kElementwiseThreads, 0, stream>>>(
      padded, dout, rows, out_channels, padded_channels);
  CHECK_LAUNCH();
  MatmulBackwardArgs<T> from_padded = args;
  from_padded.dout = padded;
  input_gradient_strided(blas, from_padded, padded_channels);
  weight_gradient_strided(blas,
                          ClassifierWeightGradientArgs<T>{dweight, padded, inp, rows, in_channels,
                                                          out_channels, 0, out_channels},
                          padded_channels);
  if (dbias != nullptr) {
    const size_t padded_floats = padded_rows_floats(rows, out_channels);
    launch_column_sums(stream, dbias, dout, rows, out_channels, scratch.data + padded_floats,
                       scratch.elems - padded_floats);
  }
}

void check_logits_stride(int vocab, int logits_stride) {
  SCALESTUDY_CHECK(logits_stride == padded_logits_row_elems(vocab),
                   "classifier matmul: logits rows must be padded_logits_row_elems(vocab) apart");
}

// fp32 logits are never padded; 16-bit ones always are.
void check_classifier_logits_stride(const float*, int vocab, int logits_stride) {
  SCALESTUDY_CHECK(logits_stride == vocab, "classifier matmul: fp32 logits rows must be vocab apart");
}
template <class T>
void check_classifier_logits_stride(const T*, int vocab, int logits_stride) {
  check_logits_stride(vocab, logits_stride);
}

// Both parts of the classifier's backward: the checks (the logits' row stride, the shape,
// dlogits and the other operands, none null, and the cuBLAS handle bound to the stream), then
// run_rows(first, count) on each chunk of rows.
template <class Args, class RunRows>
void for_each_classifier_chunk(const Blas& blas, cudaStream_t stream, const Args& args,
                               int logits_stride, std::initializer_list<NamedOperand> operands,
                               RunRows run_rows) {
  check_classifier_logits_stride(args.dlogits, args.vocab, logits_stride);
  check_operands(blas, stream, args.rows, args.channels, args.vocab, operands);
  check_not_null(args.dlogits, "classifier dlogits");
  for_each_row_chunk(args.rows, args.channels, logits_stride, run_rows);
}

// The rows [first, first + count) of a dense layer's arguments: every activation pointer
// moves on by `first` of its rows (in_channels or out_channels long). The parameter
// gradients' backward leaves dinp null.
template <class T>
void skip_rows(MatmulForwardArgs<T>& args, size_t first) {
  args.out += first * args.out_channels;
  args.inp += first * row_stride(args.inp_stride, args.in_channels);
  if (args.residual != nullptr) args.residual += first * args.out_channels;
}
template <class T>
void skip_rows(MatmulBackwardArgs<T>& args, size_t first) {
  if (args.dinp != nullptr) args.dinp += first * args.in_channels;
  args.dout += first * args.out_channels;
  args.inp += first * row_stride(args.inp_stride, args.in_channels);
}
template <class Args>
Args rows_of(Args args, int first, int count) {
  skip_rows(args, size_t(first));
  args.rows = count;
  return args;
}

}  // namespace

void launch_matmul_forward(const Blas& blas, cudaStream_t stream,
                           const MatmulForwardArgs<float>& args) {
  check_residual_apart(args);
  for_each_layer_row_chunk(args, [&](int first, int count) {
    matmul_forward(blas, stream, rows_of(args, first, count));
  });
}

size_t matmul_forward_scratch_elems_16bit(int rows, int out_channels) {
  return matmul_forward_scratch_elems_padded(rows, out_channels);
}

template <class Half>
void launch_matmul_forward(const Blas& blas, cudaStream_t stream,
                           const MatmulForwardArgs<Half>& args, Scratch scratch,
                           LtGemm* bias_gemm) {
  check_residual_apart(args);
  for_each_layer_row_chunk(args, [&](int first, int count) {
    matmul_forward_16bit(blas, stream, rows_of(args, first, count), scratch, bias_gemm);
  });
}

size_t augmented_weight_gradient_elems(int in_channels, int out_channels) {
  return size_t(in_channels + kAugmentedColumns) * size_t(out_channels);
}

size_t matmul_backward_scratch_elems(int rows, int out_channels) {
  return size_t(column_partial_rows(rows)) * size_t(out_channels);
}

void launch_matmul_backward(const Blas& blas, cudaStream_t stream,
                            const MatmulBackwardArgs<float>& args, Scratch scratch) {
  for_each_layer_row_chunk(args, [&](int first, int count) {
    matmul_backward(blas, stream, rows_of(args, first, count), scratch);
  });
}

size_t matmul_backward_scratch_elems_16bit(int rows, int out_channels) {
  return matmul_backward_scratch_elems_padded(rows, out_channels);
}

template <class Half>
void launch_matmul_backward(const Blas& blas, cudaStream_t stream,
                            const MatmulBackwardArgs<Half>& args, Scratch scratch) {
  for_each_layer_row_chunk(args, [&](int first, int count) {
    matmul_backward_16bit(blas, stream, rows_of(args, first, count), scratch);
  });
}

// The 16-bit parameter gradients alone, for a backward whose input gradient another GEMM
// computes (gelu.cuh); that GEMM reads dout in place, so its rows need no padding.
template <class T>
void launch_matmul_parameter_gradients(const Blas& blas, cudaStream_t stream,
                                       const MatmulBackwardArgs<T>& args, Scratch scratch) {
  check_operands(blas, stream, args.rows, args.in_channels, args.out_channels,
                 {{args.dweight, "matmul dweight"}, {args.dout, "matmul dout"},
                  {args.inp, "matmul inp"}});
  SCALESTUDY_CHECK(!needs_padding(args.out_channels),
                   "matmul parameter gradients: out_channels must be a multiple of 8");
  for_each_layer_row_chunk(args, [&](int first, int count) {
    matmul_parameter_gradients(blas, stream, rows_of(args, first, count), scratch);
  });
}

int padded_logits_row_elems(int vocab) { return rounded_up(vocab, kRowLineElems); }

int augmented_row_elems(int channels) { return rounded_up(channels + kAugmentedColumns, kRowLineElems); }

namespace {

// One thread an element of the augmented columns.
template <class T>
__global__ void augmented_columns_kernel(T* __restrict__ rows, int count, int channels, int stride) {
  const int thread = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = thread / kAugmentedColumns;
  if (row < count) write_augmented_columns(rows + size_t(row) * stride + channels, thread % kAugmentedColumns);
}

}  // namespace

template <class Half>
void launch_augmented_columns(cudaStream_t stream, Half* rows, int count, int channels, int stride) {
  check_row_stride(stride, channels, "augmented columns");
  SCALESTUDY_CHECK(stride != 0, "augmented columns: the rows are plain");
  const int threads = count * kAugmentedColumns;
  augmented_columns_kernel<<<(threads + kElementwiseThreads - 1) / kElementwiseThreads, kElementwiseThreads, 0,
                             stream>>>(rows, count, channels, stride);
  CHECK_LAUNCH();
}

// The tied LM head on logits rows already padded: no copy into or out of scratch.
template <class T>
void launch_classifier_matmul_forward(const Blas& blas, cudaStream_t stream,
                                      const ClassifierForwardArgs<T>& args, int logits_stride) {
  check_logits_stride(args.vocab, logits_stride);
  check_operands(blas, stream, args.rows, args.channels, args.vocab,
                 {{args.logits, "classifier logits"}, {args.inp, "classifier inp"},
                  {args.weight, "classifier weight"}});
  for_each_row_chunk(args.rows, args.channels, logits_stride, [&](int first, int count) {
    matmul_forward_strided(blas,
                           MatmulForwardArgs<T>{args.logits + size_t(first) * logits_stride,
                                                args.inp + size_t(first) * args.channels,
                                                args.weight, nullptr, count, args.channels,
                                                args.vocab},
                           logits_stride);
  });
}

// The LM head's backward on logits rows logits_stride apart (padded in 16 bits, the vocabulary
// in fp32), in the two parts that the model runs apart.
template <class T>
void launch_classifier_input_gradient(const Blas& blas, cudaStream_t stream,
                                      const ClassifierInputGradientArgs<T>& args,
                                      int logits_stride) {
  // The dense layer's input gradient, of a chunk: the classifier has no bias, and its
  // weight gradient is launch_classifier_weight_gradient's.
  const auto input_gradient_of_rows = [&](int first, int count) {
    const MatmulBackwardArgs<T> chunk{args.dinp + size_t(first) * args.channels,
                                      nullptr,
                                      nullptr,
                                      args.dlogits + size_t(first) * logits_stride,
                                      nullptr,
                                      args.weight,
                                      count,
                                      args.channels,
                                      args.vocab,
                                      args.dinp_write};
    input_gradient_strided(blas, chunk, logits_stride);
  };
  for_each_classifier_chunk(blas, stream, args, logits_stride,
                            {{args.dinp, "classifier dinp"}, {args.weight, "classifier weight"}},
                            input_gradient_of_rows);
}

template <class T>
void launch_classifier_weight_gradient(const Blas& blas, cudaStream_t stream,
                                       const ClassifierWeightGradientArgs<T>& args,
                                       int logits_stride) {
  for_each_classifier_chunk(blas, stream, args, logits_stride,
                            {{args.dweight, "classifier dweight"}, {args.inp, "classifier inp"}},
                            [&](int first, int count) {
                              ClassifierWeightGradientArgs<T> chunk = args;
                              chunk.dlogits += size_t(first) * logits_stride;
                              chunk.inp += size_t(first) * args.channels;
                              chunk.rows = count;
                              weight_gradient_strided(blas, chunk, logits_stride);
                            });
}

// The storage types the backend runs the classifier in.
#define SCALESTUDY_MATMUL_16BIT_INSTANCES(Half)                                                    \
  template void launch_matmul_forward(const Blas&, cudaStream_t, const MatmulForwardArgs<Half>&,   \
                                      Scratch, LtGemm*);                                     \
  template void launch_matmul_backward(const Blas&, cudaStream_t,                                  \
                                       const MatmulBackwardArgs<Half>&, Scratch);                  \
  template void launch_matmul_parameter_gradients(const Blas&, cudaStream_t,                       \
                                                  const MatmulBackwardArgs<Half>&, Scratch);       \
  template void launch_classifier_matmul_forward(const Blas&, cudaStream_t,                        \
                                                 const ClassifierForwardArgs<Half>&, int);         \
  template void launch_augmented_columns(cudaStream_t, Half*, int, int, int);
#define SCALESTUDY_CLASSIFIER_INSTANCES(T)                                                         \
  template void launch_classifier_input_gradient(const Blas&, cudaStream_t,                        \
                                                 const ClassifierInputGradientArgs<T>&, int);      \
  template void launch_classifier_weight_gradient(const Blas&, cudaStream_t,                       \
                                                  const ClassifierWeightGradientArgs<T>&, int);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_MATMUL_16BIT_INSTANCES)
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_CLASSIFIER_INSTANCES)
#undef SCALESTUDY_MATMUL_16BIT_INSTANCES
#undef SCALESTUDY_CLASSIFIER_INSTANCES

}  // namespace scalestudy::cuda
