#pragma once
// cuBLASLt's algorithms for one GEMM: the heuristic's candidates, the configurations near
// them, and the text form --gemm-algos-file keeps them in.
//
// Why look beyond the heuristic. Its candidates are ranked without running, and for GPT-2
// small's step they share a handful of tiles: for the qkv forward at batch 64, none of its
// first eight is as fast as a 128 x 168 tile in 2 x 1 clusters under sustained load, in a
// search of every configuration near them (docs/performance.md). Such
// configurations (other tiles, custom options, cluster shapes and swizzling) are many: over
// 8000 for a plain GEMM. lt_neighbours therefore searches in two passes of short bursts,
// first the tiles and custom options (the 128 x 168 tile is fast with a custom option that
// no candidate has), then the cluster shapes with the custom options around the fastest,
// and hands the fastest few to the sustained choice, which has the last word
// (gemm_sustained.cuh).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace scalestudy::cuda {

// The alignment lt_candidates asks of every operand, its pointer and its columns, and so
// the alignment a GEMM needs to run through the algorithms here.
inline constexpr uint32_t kLtOperandAlignmentBytes = 16;
inline bool lt_aligned(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % kLtOperandAlignmentBytes == 0;
}

// One GEMM as cuBLASLt takes it: its descriptor and layouts (D laid out as C), the types
// its algorithms are made for, and the workspace they may use.
struct LtProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cudaDataType_t ab_type = CUDA_R_16BF;
  cudaDataType_t c_type = CUDA_R_16BF;
  size_t workspace_bytes = 0;
};

// cuBLASLt's first `count` algorithms for the problem, with the preferences every cuBLASLt
// GEMM here takes: the problem's workspace at most, split-K reduced in the compute type,
// every operand 16-byte aligned. Empty where cuBLASLt has none.
std::vector<cublasLtMatmulAlgo_t> lt_candidates(const LtProblem& problem, int count);

// An algorithm's configuration, "lt id=... tile=... stages=... splitk=... reduction=...
// swizzle=... custom=... inner=... cluster=...": what --gemm-algos-file keeps of it.
std::string lt_algorithm_config(const cublasLtMatmulAlgo_t& algo);

// The algorithm of that configuration, where cuBLASLt accepts it for the problem
// (cublasLtMatmulAlgoCheck); nothing for a malformed text or a refused configuration.
std::optional<cublasLtMatmulAlgo_t> lt_algorithm_of(const LtProblem& problem, const std::string& config);

// How many configurations lt_neighbours returns, and around how many of its first pass's
// fastest its second pass searches.
inline constexpr int kNeighbourConfigurations = 8;
inline constexpr int kNeighbourTiles = 8;

// A launch of the problem through one algorithm, with cuBLAS's status; its output must be
// safe to overwrite.
using LtLaunch = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>;

// Up to kNeighbourConfigurations configurations that none of `candidates` is, fastest first
// in a burst of one call each: first every tile and custom option of each kind of candidate
// (algorithm, stages, split-K), then, around the kNeighbourTiles fastest configurations so
// far, every cluster shape of up to 2 x 2, swizzling and custom option. Each configuration
// cuBLASLt accepts runs on `stream`.
std::vector<cublasLtMatmulAlgo_t> lt_neighbours(const LtProblem& problem,
                                                const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                                cudaStream_t stream, const LtLaunch& launch);

}  // namespace scalestudy::cuda
