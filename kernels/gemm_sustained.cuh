#pragma once
// GEMM algorithms chosen by their time under sustained load (--gemm-algos sustained).
//
// Why sustained. A training step keeps the GPU busy from end to end, and a power-capped GPU
// (an H100 or H200 at 700 W) runs it at the cap: the clock falls until the power fits, so
// a kernel lasts about its energy over the cap. Timed alone, in a short burst, a kernel
// runs at the boost clock instead, and the two rankings differ: a candidate that is faster
// in a burst can spend more energy at the cap, and so lengthen the step
// (dev/op_timings StepGemmEnergy measures both).
//
// How long. The power controller takes longer than a short run to settle on a candidate's
// clock, and choices made from runs of tens of milliseconds lengthen the step rather than
// shorten it. Each candidate here therefore runs back to back for kSustainedLeadMs
// untimed, then kSustainedWindowMs timed, with the GPU loaded throughout; at the cap its
// time a call is its energy over the cap. With the search's bursts (lt_algorithms.cuh)
// that is tens of seconds a shape, minutes for a model's shapes: --gemm-algos-file keeps
// the choices.
//
// The candidates are the algorithm the step would otherwise take (cuBLAS's own for a plain
// GEMM, cuBLASLt's first for one with an epilogue), cuBLASLt's first kSustainedCandidates,
// and the kNeighbourConfigurations configurations near them that run fastest in a burst
// (lt_algorithms.cuh). The fastest is timed once more beside the default, and replaces
// it only where the two runs of each leave it kSustainedRequiredGainPercent faster: the
// least of seventeen noisy figures is biased low.
//
// A GEMM whose output it adds to (beta = 1: the weight gradients) is timed on its own
// output, which is saved first and restored after, so the call the step makes adds to
// what it would have added to. Choices are made once per GemmTuner for each shape, at its
// first call; they are the same bits on every call of the process, and may differ between
// runs (--gemm-algos heuristic gives the same bits on every run).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/gemm_choice_file.h"
#include "gemm.cuh"
#include "lt_algorithms.cuh"

namespace scalestudy::cuda {

inline constexpr int kSustainedCandidates = 8;
inline constexpr double kSustainedLeadMs = 300.0;
inline constexpr double kSustainedWindowMs = 500.0;
inline constexpr double kSustainedRequiredGainPercent = 1.0;

// One way to run a GEMM, for choose_sustained: cuBLAS's status of the launch (a candidate
// the heuristic offered may still be refused at launch).
using GemmLaunch = std::function<cublasStatus_t()>;

// Milliseconds between two events around `calls` launches on `stream`, each checked.
double timed_ms(cudaStream_t stream, const GemmLaunch& launch, int calls);

// Which of `launches` to keep, launches[0] being the default, and each one's sustained
// milliseconds a call (negative where it was refused; the mean of two runs for the default
// and the fastest). Runs every launch many times on `stream`: their outputs must be safe to
// overwrite.
struct SustainedChoice {
  int kept = 0;
  std::vector<double> ms;
};
SustainedChoice choose_sustained(cudaStream_t stream, const std::vector<GemmLaunch>& launches);

// A sustained choice among cuBLASLt's candidates for one problem and the configurations
// near them. The default is `fallback` where given (a plain GEMM: cuBLAS's own), else the
// first candidate (a GEMM with an epilogue: cuBLASLt's first).
struct SustainedSearch {
  LtProblem problem;
  std::vector<cublasLtMatmulAlgo_t>* candidates;  // the configurations near them are added
  cudaStream_t stream;
  LtLaunch launch;
  GemmLaunch fallback;  // empty: none
  std::string fallback_name;
};
// The index kept among *search.candidates (-1: the fallback), and the run's summary of it.
struct SustainedPick {
  int kept = -1;
  std::string description;
};
SustainedPick pick_sustained(const SustainedSearch& search);

// The GPU's model and cuBLASLt's version, for which --gemm-algos-file's choices hold.
std::string gemm_machine(int device);

// The plain 16-bit GEMMs (no epilogue, one matrix, alpha = 1) through the algorithm chosen
// for their shape, leading dimensions, types, beta and multiprocessor target.
class GemmTuner {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Takes the choices `file` holds (none: null) and stores the ones it makes there.
  explicit GemmTuner(GemmChoiceFile* file);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // The multiprocessors the GEMMs from now on are sized for, as cublasSetSmCountTarget.
  void set_multiprocessor_target(int multiprocessors) { multiprocessor_target_ = multiprocessors; }
  // Runs g, choosing its algorithm at the first call of its shape; false, having done
  // nothing, where g is not a GEMM this takes (the caller runs cuBLAS's own).
  bool run(cublasHandle_t handle, const GemmArgs& g);
  // One line per chosen shape.
  std::vector<std::string> algorithm_report() const;

 private:
  // op_a, op_b, m, n, k, lda, ldb, ldc, the A/B type, the C type, beta != 0, the target.
  using Key = std::array<long long, 12>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, then the neighbours or the file's
    int kept = -1;  // the candidate's index; -1: cuBLAS's own
    std::string choice;
  };
  Plan make_plan(const GemmArgs& g) const;
  LtProblem problem_of(const Plan& plan, const GemmArgs& g) const;
  // Sets plan.kept from the file, or by timing (then stored in the file).
  void choose(Plan& plan, cublasHandle_t handle, cudaStream_t stream, const GemmArgs& g);
  // Sets plan.kept by timing; false where it could not time (cuBLAS's own stays).
  bool time_candidates(Plan& plan, cublasHandle_t handle, cudaStream_t stream, const GemmArgs& g);
  std::string shape_of(const GemmArgs& g) const;
  cublasStatus_t launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, cudaStream_t stream,
                        const GemmArgs& g) const;

  GemmChoiceFile* file_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  int multiprocessor_target_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace scalestudy::cuda
