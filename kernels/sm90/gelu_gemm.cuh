#pragma once
// GPT-2's two MLP GEMMs that carry a GELU, in a Hopper kernel of the project's own. Both
// have the shape [tokens, 4C] = [tokens, C] x [4C, C]^T: the first dense layer's forward
// (out = gelu(acc + bias), with acc + bias kept as pre for the backward) and the second's
// input gradient (out = gelu'(pre) * acc). cuBLASLt's epilogues for them run at about two
// thirds of the rate of its plain GEMMs of the same size (docs/performance.md), because a
// tile's epilogue leaves the tensor cores idle. Here two consumer warpgroups take turns:
// while one runs its tile's epilogue, the other runs the next tile's MMAs.
//
// The kernel: persistent clusters of two CTAs, one CTA per multiprocessor, over the
// output's 256 x 192 blocks in row-major order (so the blocks in flight share a few rows of
// A, and all of B stays in L2); each CTA of a cluster takes one 128-row half of the block.
// A producer warpgroup loads 64-deep slices with TMA into a ring of stages: its CTA's A,
// and half of B, multicast into both CTAs. The two consumer warpgroups take the CTA's
// tiles in turn, each a whole 128 x 192 tile with wgmma, and store its epilogue from the
// registers. Each output value is one fp32 sum over the depth in a fixed order, rounded
// once after the epilogue's arithmetic (gelu_math.cuh's fast forms of the tanh GELU): the
// results do not depend on the grid or the run.
//
// bf16 only, on a device of compute capability 9.0, with rows a multiple of 256, columns
// of 192 (GPT-2 small's 3072, not medium's 4096), depth of 64 and every operand 16-byte
// aligned: takes() says whether a
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
  // fit), rounded down to whole clusters.
  void run(cudaStream_t stream, const GeluGemmCall& call, int multiprocessors);
  // The CTAs that run at once on this device (whole clusters, one a multiprocessor).
  int resident_ctas() const { return resident_ctas_; }
  // weight[rows, columns] transposed into [columns, rows], in a buffer this object keeps
  // until the next call: the input gradient's b, which the kernel takes K-major.
  const void* transposed(cudaStream_t stream, const void* weight, int rows, int columns);

 private:
  bool device_is_hopper_ = false;
  int device_multiprocessors_ = 0;
  int resident_ctas_ = 0;  // the CTAs of the clusters that fit on the device at once
  void* transposed_ = nullptr;
  size_t transposed_elems_ = 0;
};

}  // namespace scalestudy::cuda::sm90
