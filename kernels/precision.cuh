#pragma once
// Storage types of the kernels that are templated on them: fp32 (float), bf16
// (__nv_bfloat16) and fp16 (__half). The arithmetic is fp32 whatever the storage: values
// are widened (exactly) on load and rounded to nearest even once, on store. For float
// every helper is the identity, so a float instantiation performs exactly the fp32
// kernel's operations. fp16 keeps 11 significant bits but only the range up to 65504: a
// store of anything at or above 65520 in magnitude gives +-inf (IEEE rounding, never a
// clamp), which is how an overflow reaches the fp32 gradients and the trainer's
// non-finite check. Included from .cu files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "common.cuh"
#include "op_params.h"

namespace scalestudy::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// The explicit instantiations of a kernel family's launchers: INSTANCES(T) declares those
// of storage type T, here for every storage type, or for the 16-bit ones.
#define SCALESTUDY_FOR_EACH_STORAGE(INSTANCES) INSTANCES(float) INSTANCES(bf16) INSTANCES(fp16)
#define SCALESTUDY_FOR_EACH_16BIT_STORAGE(INSTANCES) INSTANCES(bf16) INSTANCES(fp16)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(fp16 x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ fp16 from_float<fp16>(float x) { return __float2half_rn(x); }

// 16 bytes of T, the unit of vectorised loads and stores (4 floats, or 8 bf16 or fp16).
template <class T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T values[kCount];
  __device__ __forceinline__ float get(int i) const { return to_float(values[i]); }
  __device__ __forceinline__ void set(int i, float x) { values[i] = from_float<T>(x); }
};

// p must be 16-byte aligned.
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> pack;
  *reinterpret_cast<int4*>(&pack) = *reinterpret_cast<const int4*>(p);
  return pack;
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& pack) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&pack);
}

// Host side: whether a pointer allows 16-byte accesses.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Elementwise kernels over packs: where every pointer of a call is 16-byte aligned,
// threads walk whole packs and then the elems % kCount tail element by element;
// otherwise everything goes element by element (packs = 0). An element's arithmetic is
// the same on both paths, so they give the same bits.
template <class T>
size_t pack_count(size_t elems, bool aligned) {
  return aligned ? elems / Pack<T>::kCount : 0;
}
// The grid for such a kernel: sized by the work items, packs plus tail elements.
template <class T>
int packed_blocks(size_t elems, size_t packs) {
  return elementwise_blocks(packs > 0 ? packs + elems % Pack<T>::kCount : elems);
}

// The grid-stride walk of such a kernel: pack_at(i) for the first element i of each of the
// `packs` whole packs, then element_at(i) for each element past them.
template <class T, class PackAt, class ElementAt>
__device__ __forceinline__ void for_each_pack_then_element(size_t elems, size_t packs,
                                                           PackAt pack_at, ElementAt element_at) {
  constexpr int kCount = Pack<T>::kCount;
  const size_t first = grid_thread_index();
  const size_t stride = grid_threads();
  for (size_t p = first; p < packs; p += stride) pack_at(p * kCount);
  for (size_t i = packs * kCount + first; i < elems; i += stride) element_at(i);
}

// Launches such a kernel over `elems` elements of T, as kernel(args..., elems, packs), with
// packs where every operand (none of which may be null) is 16-byte aligned. An empty range
// launches nothing.
template <class T, class... Params, class... Args>
void launch_packed(cudaStream_t stream, void (*kernel)(Params...), size_t elems,
                   std::initializer_list<NamedOperand> operands, Args... args) {
  if (elems == 0) return;
  bool aligned = true;
  for (const NamedOperand& operand : operands) {
    check_not_null(operand.pointer, operand.name);
    aligned = aligned && aligned16(operand.pointer);
  }
  const size_t packs = pack_count<T>(elems, aligned);
  kernel<<<packed_blocks<T>(elems, packs), kElementwiseThreads, 0, stream>>>(args..., elems, packs);
  CHECK_LAUNCH();
}

// The columns an augmented row carries after its channels (op_params.h): 1, then zeros,
// one a thread for threads 0 .. kAugmentedColumns - 1.
template <class T>
__device__ __forceinline__ void write_augmented_columns(T* columns, int thread) {
  if (thread < kAugmentedColumns) columns[thread] = from_float<T>(thread == 0 ? 1.0f : 0.0f);
}

}  // namespace scalestudy::cuda
