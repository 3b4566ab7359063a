#pragma once
// cuBLASLt's algorithms as text, and the file of chosen algorithms that --gemm-algos-file
// reads: the one way a run takes algorithms other than cuBLASLt's heuristic and the timed
// sizing (gemm_lt.cuh). A search that times each GEMM of a step under sustained load makes
// such a file (docs/strategies.md says how, docs/performance.md what it gains).
//
// A choice holds only on the GPU model and cuBLASLt version it was made with, which the
// file's first line names; a file made elsewhere is set aside, not read. The format, one
// entry a line after the header:
//   scalestudy gemm algorithms for <machine>
//   <shape><TAB><algorithm>
// The shape is LtGemm's text of a GEMM (gemm_lt.cuh), the algorithm lt_algorithm_config's
// text or "cublas" (cuBLAS's own, for a GEMM without an epilogue); both are free of tabs
// and line breaks. A later entry for a shape replaces an earlier one.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace scalestudy::cuda {

// The alignment lt_candidates asks of every operand, its pointer and its columns, and so
// the alignment a GEMM needs to run through cuBLASLt here.
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
// swizzle=... custom=... inner=... cluster=...": what a choice file keeps of it.
std::string lt_algorithm_config(const cublasLtMatmulAlgo_t& algo);

// The algorithm of that configuration, where cuBLASLt accepts it for the problem
// (cublasLtMatmulAlgoCheck); nothing for a malformed text or a refused configuration.
std::optional<cublasLtMatmulAlgo_t> lt_algorithm_of(const LtProblem& problem, const std::string& config);

// Sets one configuration attribute, through the low bytes of a 64-bit value (each
// attribute has its own width, which cuBLASLt gives when asked).
cublasStatus_t set_lt_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute,
                             uint64_t value);
uint64_t lt_config_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute);

// The GPU's model and cuBLASLt's version, for which a choice file's choices hold.
std::string gemm_machine(int device);

// A launch of one GEMM, with cuBLAS's status (an algorithm may be refused at launch).
using GemmLaunch = std::function<cublasStatus_t()>;
using LtLaunch = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>;

// One GEMM at the first call of its shape, as LtGemm asks a GemmChooser about it: its text
// (a choice file's key), its problem, and launches on that call's own operands, which
// every launch overwrites (or, for a GEMM that adds to its output, adds to again).
struct GemmToChoose {
  std::string shape;
  LtProblem problem;
  cudaStream_t stream = nullptr;
  LtLaunch launch;       // through one algorithm
  GemmLaunch fallback;   // what runs without a choice: cuBLAS's own, or cuBLASLt's first
  bool plain = false;    // no epilogue: "cublas" is a choice
};

// What picks an algorithm for a GEMM: its text (lt_algorithm_config's, or "cublas"), or
// nothing to keep the default.
class GemmChooser {
 public:
  virtual ~GemmChooser() = default;
  virtual std::optional<std::string> choose(const GemmToChoose& gemm) = 0;
};

// The choices of one machine, read from and written to a choice file.
class GemmChoiceFile final : public GemmChooser {
 public:
  // Reads `path`, made for `machine`, or throws std::invalid_argument naming the file (and
  // the line) where it cannot be read or is not in the format. A file made for another
  // machine gives no choices, and set_aside_because() says why.
  static GemmChoiceFile read(const std::string& path, const std::string& machine);

  // Why the file's choices were set aside (another machine), or empty.
  const std::string& set_aside_because() const { return set_aside_because_; }
  std::optional<std::string> find(const std::string& shape) const;
  std::optional<std::string> choose(const GemmToChoose& gemm) override { return find(gemm.shape); }
  void store(const std::string& shape, const std::string& algorithm);
  size_t size() const { return choices_.size(); }
  // Writes every choice, for `machine`, through a temporary beside `path` and a rename, so
  // that a reader never sees half a file.
  void write(const std::string& path, const std::string& machine) const;

 private:
  std::string set_aside_because_;
  std::map<std::string, std::string> choices_;
};

}  // namespace scalestudy::cuda
