#pragma once
// How the CUDA backend's ops dispatch on the 16-bit storage of its activations: the
// storage type of a precision, and typed views of the float* handles. Shared by the
// backend's source files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "core/precision.h"

namespace scalestudy::cuda_storage {

// Both 16-bit storage types take 2 bytes an element.
inline constexpr size_t kHalfBytes = 2;
static_assert(sizeof(__nv_bfloat16) == kHalfBytes && sizeof(__half) == kHalfBytes);

// The 16-bit storage type of a precision, as a value to dispatch on.
template <class T>
struct Storage {
  using type = T;
};

// Calls f(Storage<T>{}) with T the 16-bit type of `precision`: __half for fp16,
// __nv_bfloat16 for bf16 (the only other precision that has 16-bit storage).
template <class F>
void with_half_type(Precision precision, F&& f) {
  if (precision == Precision::fp16)
    f(Storage<__half>{});
  else
    f(Storage<__nv_bfloat16>{});
}

// Calls f(Storage<T>{}) with T the 16-bit type of `precision` where `half`, and with T =
// float where not: for the ops whose fp32 and 16-bit launchers take the same arguments.
template <class F>
void with_storage_type(bool half, Precision precision, F&& f) {
  if (half)
    with_half_type(precision, f);
  else
    f(Storage<float>{});
}

// Typed views of float* handles whose storage the registry reported as 16-bit (or, with
// T = float, the handles themselves).
template <class T>
T* as(float* ptr) {
  return reinterpret_cast<T*>(ptr);
}
template <class T>
const T* as(const float* ptr) {
  return reinterpret_cast<const T*>(ptr);
}
template <class T>
const T* as(const void* ptr) {
  return static_cast<const T*>(ptr);
}

}  // namespace scalestudy::cuda_storage
