#include "embedding.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <string>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

struct EmbeddingParams {
  int batch, seq, channels;
};

// T is the storage of out and of the tables (fp32, bf16 or fp16); each sum is one fp32
// addition rounded once to T. A row of C channels is whole 16-byte packs where packs > 0
// (C a multiple of the pack, every pointer aligned): a thread then takes a pack of one
// row, a wte row's pack and a wpe row's pack. The elements, on either path, are the same
// sums.
template <class T>
__global__ void embedding_forward_kernel(T* __restrict__ out,
                                         const int32_t* __restrict__ tokens,
                                         const T* __restrict__ wte,
                                         const T* __restrict__ wpe, EmbeddingParams p,
                                         size_t elems, size_t packs) {
  constexpr int kCount = Pack<T>::kCount;
  // Where element i's addends sit in the tables, and its token.
  struct Place {
    size_t wte_at, wpe_at;
    int32_t token;
  };
  const auto place_of = [&](size_t i) {
    const size_t row = i / p.channels;
    const int c = static_cast<int>(i - row * p.channels);
    const int t = static_cast<int>(row % p.seq);
    const int32_t token = tokens[row];
    return Place{size_t(token) * p.channels + c, size_t(t) * p.channels + c, token};
  };
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        const Place at = place_of(i);
        Pack<T> sums;
        if (at.token >= 0) {
          const Pack<T> token_row = load_pack(wte + at.wte_at);
          const Pack<T> position_row = load_pack(wpe + at.wpe_at);
#pragma unroll
          for (int k = 0; k < kCount; ++k) sums.set(k, token_row.get(k) + position_row.get(k));
        } else {
#pragma unroll
          for (int k = 0; k < kCount; ++k) sums.set(k, NAN);
        }
        store_pack(out + i, sums);
      },
      [&](size_t i) {
        const Place at = place_of(i);
        out[i] = from_float<T>(at.token >= 0 ? to_float(wte[at.wte_at]) + to_float(wpe[at.wpe_at])
                                             : NAN);
      });
}

// One thread per (t, c): the batch rows of one position are summed in increasing b.
// T is the storage of dout; the gradients are fp32 and accumulate in fp32.
template <class T>
__global__ void embedding_backward_wpe_kernel(float* __restrict__ dwpe,
                                              const T* __restrict__ dout,
                                              EmbeddingParams p) {
  const size_t elems = size_t(p.seq) * p.channels;
  const size_t batch_stride = size_t(p.seq) * p.channels;
  for (size_t i = grid_thread_index(); i < elems; i += grid_threads()) {
    float total = dwpe[i];
    for (int b = 0; b < p.batch; ++b) total += to_float(dout[b * batch_stride + i]);
    dwpe[i] = total;
  }
}

constexpr int kWteThreads = 256;

// Rows 0..rows-1, the values the sort carries along with the token ids.
__global__ void row_indices_kernel(int32_t* __restrict__ rows_out, int rows) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) rows_out[r] = r;
}

// Repeated tokens would make a row-parallel scatter race. The (token, row) pairs are
// sorted by token first, stably, so each token's rows stay in increasing order; block i
// owns the run of equal tokens that starts at sorted position i (every other block
// returns at once) and writes that dwte row, adding the dout rows of the run in turn. No
// atomics, the fixed order of increasing rows, and dout read once.
template <class T>
__global__ void embedding_backward_wte_kernel(float* __restrict__ dwte,
                                              const T* __restrict__ dout,
                                              const int32_t* __restrict__ sorted_tokens,
                                              const int32_t* __restrict__ sorted_rows, int rows,
                                              int channels) {
  const int first = blockIdx.x;
  const int32_t token = sorted_tokens[first];
  if (token < 0 || (first > 0 && sorted_tokens[first - 1] == token)) return;
  int end = first + 1;
  while (end < rows && sorted_tokens[end] == token) ++end;
  float* dwte_row = dwte + size_t(token) * channels;
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    float value = dwte_row[c];
    for (int k = first; k < end; ++k) value += to_float(dout[size_t(sorted_rows[k]) * channels + c]);
    dwte_row[c] = value;
  }
}

// The scratch of the wte backward, each part starting on a 256-byte boundary as CUB
// expects of its temporary storage: the sorted tokens, the rows, the sorted rows, then
// CUB's own.
struct WteScratch {
  size_t ids_bytes = 0, sort_bytes = 0;
  size_t total_bytes() const { return 3 * ids_bytes + sort_bytes; }
};

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

WteScratch wte_scratch(int rows) {
  WteScratch scratch;
  scratch.ids_bytes = round_up_256(size_t(rows) * sizeof(int32_t));
  CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, scratch.sort_bytes, static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), rows));
  scratch.sort_bytes = round_up_256(scratch.sort_bytes);
  return scratch;
}

void check_shape(int batch, int seq, int channels) {
  check_positive(batch, "embedding batch");
  check_positive(seq, "embedding seq");
  check_positive(channels, "embedding channels");
  SCALESTUDY_CHECK(static_cast<long long>(batch) * seq < (1ll << 31),
                   "embedding: batch*seq must fit in an int");
}

}  // namespace

template <class T>
void launch_embedding_forward(cudaStream_t stream, const EmbeddingForwardArgs<T>& args) {
  const auto& [out, tokens, wte, wpe, batch, seq, channels] = args;
  check_shape(batch, seq, channels);
  check_not_null({{out, "embedding out"},
                  {tokens, "embedding tokens"},
                  {wte, "embedding wte"},
                  {wpe, "embedding wpe"}});
  const EmbeddingParams p{batch, seq, channels};
  const size_t elems = size_t(batch) * seq * channels;
  const bool whole_packs = channels % Pack<T>::kCount == 0 && aligned16(out) && aligned16(wte) &&
                           aligned16(wpe);
  const size_t packs = pack_count<T>(elems, whole_packs);
  embedding_forward_kernel<T><<<packed_blocks<T>(elems, packs), kElementwiseThreads, 0, stream>>>(
      out, tokens, wte, wpe, p, elems, packs);
  CHECK_LAUNCH();
}

size_t embedding_backward_scratch_elems(int batch, int seq) {
  check_positive(batch, "embedding batch");
  check_positive(seq, "embedding seq");
  return (wte_scratch(batch * seq).total_bytes() + sizeof(float) - 1) / sizeof(float);
}

template <class T>
void launch_embedding_backward(cudaStream_t stream, const EmbeddingBackwardArgs<T>& args,
                               Scratch scratch) {
  const auto& [dwte, dwpe, dout, tokens, batch, seq, channels] = args;
  check_shape(batch, seq, channels);
  check_not_null({{dwte, "embedding dwte"},
                  {dwpe, "embedding dwpe"},
                  {dout, "embedding dout"},
                  {tokens, "embedding tokens"},
                  {scratch.data, "embedding scratch"}});
  const int rows = batch * seq;
  const WteScratch sizes = wte_scratch(rows);
  SCALESTUDY_CHECK(scratch.elems * sizeof(float) >= sizes.total_bytes(),
                   "embedding backward: scratch of " + std::to_string(scratch.elems) + " floats, needs " +
                       std::to_string(sizes.total_bytes() / sizeof(float)));
  const EmbeddingParams p{batch, seq, channels};
  const size_t position_elems = size_t(seq) * channels;
  embedding_backward_wpe_kernel<T><<<elementwise_blocks(position_elems), kElementwiseThreads,
                                     0, stream>>>(dwpe, dout, p);
  CHECK_LAUNCH();
  char* base = reinterpret_cast<char*>(scratch.data);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base);
  auto* row_ids = reinterpret_cast<int32_t*>(base + sizes.ids_bytes);
  auto* sorted_rows = reinterpret_cast<int32_t*>(base + 2 * sizes.ids_bytes);
  void* sort_storage = base + 3 * sizes.ids_bytes;
  row_indices_kernel<<<elementwise_blocks(rows), kElementwiseThreads, 0, stream>>>(row_ids, rows);
  CHECK_LAUNCH();
  size_t sort_bytes = sizes.sort_bytes;
  CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, tokens, sorted_tokens, row_ids, sorted_rows,
                                             rows, 0, static_cast<int>(8 * sizeof(int32_t)), stream));
  embedding_backward_wte_kernel<T><<<rows, kWteThreads, 0, stream>>>(dwte, dout, sorted_tokens, sorted_rows, rows,
                                                                     channels);
  CHECK_LAUNCH();
}

// The storage types the backend runs the embedding in.
#define SCALESTUDY_EMBEDDING_INSTANCES(T)                                                       \
  template void launch_embedding_forward(cudaStream_t, const EmbeddingForwardArgs<T>&);         \
  template void launch_embedding_backward(cudaStream_t, const EmbeddingBackwardArgs<T>&, Scratch);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_EMBEDDING_INSTANCES)
#undef SCALESTUDY_EMBEDDING_INSTANCES

}  // namespace scalestudy::cuda
