#pragma once
// GPT-2's two MLP GEMMs that carry a GELU, in a Hopper kernel of the project's own. Both
// have the shape [tokens, 4C] = [tokens, C] x [4C, C]^T: the first dense layer's forward
// (out = gelu(acc + bias), with acc + bias kept as pre for the backward) and the second's
// input gradient (out = gelu'(pre) * acc). cuBLASLt's epilogues for them run at about two
// thirds of the rate of its plain GEMMs of the same size (docs/performance.md). This
// kernel's main loop alone runs faster than cuBLASLt's plain GEMM at these shapes.
//
// The kernel: persistent, one CTA per multiprocessor, over the output's 128 x 256 tiles in
// row-major order (so the tiles in flight share a few rows of A, and all of B stays in L2).
// One thread loads 64-deep slices of A and B with TMA into a ring of stages; two consumer
// warpgroups compute each tile together with wgmma, each its 64-row half, and write it to
// a staging tile in shared memory as 16-bit values; three epilogue warps apply the GELU
// (or its derivative) there and store the results with TMA, while the consumers run the
// next tile. Each output value is one fp32 sum over the depth in a fixed order, rounded to
// 16 bits, then put through gelu_math.cuh's fast forms of the tanh GELU, as the unfused
// path does: the results do not depend on the grid or the run.
//
// bf16 only, on a device of compute capability 9.0, with rows a multiple of 128, columns of
// 256, depth of 64 (192 at least) and every operand 16-byte aligned: takes() says whether a
// call qualifies, and the caller runs cuBLASLt otherwise.
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda::sm90 {

enum class GeluEpilogue {
  forward,         // out = gelu(acc + bias); pre = acc + bias where pre is not null
  input_gradient,  // out = gelu'(pre) * acc
};

// out[rows, columns] = epilogue(a[rows, depth] x b[columns, depth]^T), every matrix
// row-major bf16.
struct GeluGemmCall {
  GeluEpilogue epilogue = GeluEpilogue::forward;
  int rows = 0, columns = 0, depth = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  void* pre = nullptr;          // forward: written where not null; input_gradient: read
  const void* bias = nullptr;   // [columns], forward only
};

class GeluGemm {
 public:
  GeluGemm();
  ~GeluGemm();
  GeluGemm(const GeluGemm&) = delete;
  GeluGemm& operator=(const GeluGemm&) = delete;

  // Whether the kernel runs this call on the current device (see the file's comment).
  bool takes(const GeluGemmCall& call) const;
  // Runs a call that takes() accepted, on at most `multiprocessors` CTAs (0: as many as
  // fit).
  void run(cudaStream_t stream, const GeluGemmCall& call, int multiprocessors);
  // The CTAs that run at once on this device (one a multiprocessor).
  int resident_ctas() const { return resident_ctas_; }
  // weight[rows, columns] transposed into [columns, rows], in a buffer this object keeps
  // until the next call: the input gradient's b, which the kernel takes K-major.
  const void* transposed(cudaStream_t stream, const void* weight, int rows, int columns);

 private:
  bool device_is_hopper_ = false;
  int device_multiprocessors_ = 0;
  int resident_ctas_ = 0;  // the CTAs that fit on the device at once
  void* transposed_ = nullptr;
  size_t transposed_elems_ = 0;
};

}  // namespace scalestudy::cuda::sm90
