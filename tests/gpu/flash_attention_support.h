#pragma once
// What the fused attention's tests and timings share: untyped device buffers with their
// 16-bit conversions, the flash launchers for a precision, and a fixture with a stream.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "kernels/op_params.h"
#include "core/precision.h"
#include "cuda_check.h"
#include "flash_attention.cuh"

namespace scalestudy::gpu_test {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { CHECK_CUDA(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // 0xff bytes are NaN in fp32, bf16 and fp16: an element the kernel forgets stays NaN.
  void poison() { CHECK_CUDA(cudaMemset(ptr_, 0xff, bytes_)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

inline std::vector<uint16_t> to_half_bits(Precision precision, const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = half_bits_from_float(precision, values[i]);
  return bits;
}

inline void upload_half(DeviceBuffer& buffer, Precision precision, const std::vector<float>& values) {
  const auto bits = to_half_bits(precision, values);
  CHECK_CUDA(cudaMemcpy(buffer.as<void>(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
}

inline std::vector<float> download_half(const DeviceBuffer& buffer, Precision precision, size_t elems) {
  std::vector<uint16_t> bits(elems);
  CHECK_CUDA(cudaMemcpy(bits.data(), buffer.as<void>(), elems * 2, cudaMemcpyDeviceToHost));
  std::vector<float> values(elems);
  for (size_t i = 0; i < elems; ++i) values[i] = float_from_half_bits(precision, bits[i]);
  return values;
}

inline std::vector<float> download_floats(const DeviceBuffer& buffer, size_t elems) {
  std::vector<float> values(elems);
  CHECK_CUDA(cudaMemcpy(values.data(), buffer.as<void>(), elems * 4, cudaMemcpyDeviceToHost));
  return values;
}

// The launchers for the storage type of `precision`, on untyped device buffers.
inline void flash_forward(Precision precision, cudaStream_t stream, DeviceBuffer& out, DeviceBuffer& lse,
                   const DeviceBuffer& qkv, const AttentionShape& shape) {
  if (precision == Precision::bf16)
    cuda::launch_flash_attention_forward(stream, out.as<__nv_bfloat16>(), lse.as<float>(),
                                         qkv.as<__nv_bfloat16>(), shape);
  else
    cuda::launch_flash_attention_forward(stream, out.as<__half>(), lse.as<float>(),
                                         qkv.as<__half>(), shape);
}

// The buffers of the fused backward: dqkv (+)= the gradients, from dout and the forward's
// qkv, out and lse.
struct FlashBackwardBuffers {
  DeviceBuffer& dqkv;
  const DeviceBuffer& dout;
  const DeviceBuffer& qkv;
  const DeviceBuffer& out;
  const DeviceBuffer& lse;
};

inline void flash_backward(Precision precision, cudaStream_t stream,
                           const FlashBackwardBuffers& buffers, const AttentionShape& shape,
                           DeviceBuffer& scratch,
                           GradientWrite dqkv_write = GradientWrite::accumulate) {
  const cuda::Scratch device_scratch{scratch.as<float>(), scratch.bytes() / sizeof(float)};
  auto launch = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    const AttentionBackwardArgs<T, float> args{.dqkv = buffers.dqkv.as<T>(),
                                               .dout = buffers.dout.as<T>(),
                                               .qkv = buffers.qkv.as<T>(),
                                               .out = buffers.out.as<T>(),
                                               .state = buffers.lse.as<float>(),
                                               .shape = shape,
                                               .dqkv_write = dqkv_write};
    cuda::launch_flash_attention_backward(stream, args, device_scratch);
  };
  if (precision == Precision::bf16)
    launch(static_cast<__nv_bfloat16*>(nullptr));
  else
    launch(static_cast<__half*>(nullptr));
}

inline bool same_bits(const DeviceBuffer& a, const DeviceBuffer& b) {
  std::vector<unsigned char> host_a(a.bytes()), host_b(b.bytes());
  CHECK_CUDA(cudaMemcpy(host_a.data(), a.as<void>(), a.bytes(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(host_b.data(), b.as<void>(), b.bytes(), cudaMemcpyDeviceToHost));
  return host_a == host_b;
}

class FlashAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace scalestudy::gpu_test
