#pragma once
// GEMM algorithms chosen by their time under sustained load: the search behind
// `scalestudy gemm-search`, which writes the choice files that --gemm-algos-file reads
// (gemm_choice_file.cuh).
//
// Why sustained. A training step keeps the GPU busy from end to end, and a power-capped GPU
// (an H100 or H200 at 700 W) runs it at the cap: the clock falls until the power fits, so
// a kernel lasts about its energy over the cap. Timed alone, in a short burst, a kernel
// runs at the boost clock instead, and the two rankings differ: a candidate that is faster
// in a burst can spend more energy at the cap, and so lengthen the step.
//
// How long. The power controller takes longer than a short run to settle on a candidate's
// clock, and choices made from runs of tens of milliseconds lengthen the step rather than
// shorten it. Each candidate therefore runs back to back for SustainedTiming::lead_ms
// untimed, then window_ms timed, with the GPU loaded throughout; at the cap its time a
// call is its energy over the cap. That is tens of seconds a shape, minutes for a model's
// shapes.
//
// The candidates are the algorithm the step would otherwise take (cuBLAS's own for a plain
// GEMM, cuBLASLt's first for one with an epilogue), cuBLASLt's first kSustainedCandidates,
// and the kNeighbourConfigurations configurations near them that run fastest in a burst.
// The fastest is timed once more beside the default, and replaces it only where the two
// runs of each leave it kSustainedRequiredGainPercent faster: the least of seventeen noisy
// figures is biased low.
//
// Why look beyond the heuristic. Its candidates are ranked without running, and for GPT-2
// small's step they share a handful of tiles: for the qkv forward at batch 64, none of its
// first eight is as fast as a 128 x 168 tile in 2 x 1 clusters under sustained load.
// Configurations near them (other tiles, custom options, cluster shapes and swizzling) are
// many, over 8000 for a plain GEMM, so the search takes two passes of short bursts: first
// the tiles and custom options, then the cluster shapes with the custom options around the
// fastest.
#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gemm_choice_file.cuh"

namespace scalestudy::cuda {

inline constexpr int kSustainedCandidates = 8;
inline constexpr double kSustainedRequiredGainPercent = 1.0;
// How many configurations the neighbour search returns, and around how many of its first
// pass's fastest its second pass searches.
inline constexpr int kNeighbourConfigurations = 8;
inline constexpr int kNeighbourTiles = 8;

// How long each candidate runs, untimed and then timed. The defaults are the ones whose
// choices shorten the step (docs/performance.md); shorter windows serve tests of the
// search's mechanics only.
struct SustainedTiming {
  double lead_ms = 300.0;
  double window_ms = 500.0;
};

// Up to kNeighbourConfigurations configurations of the problem that none of `candidates`
// is, fastest first in a burst of one call each: first every tile and custom option of each
// kind of candidate (algorithm, stages, split-K), then, around the kNeighbourTiles fastest
// so far, every cluster shape up to 2 x 2, swizzling and custom option. Each configuration
// cuBLASLt accepts runs through `launch` on `stream`.
std::vector<cublasLtMatmulAlgo_t> lt_neighbours(const LtProblem& problem,
                                                const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                                cudaStream_t stream, const LtLaunch& launch);

// One choice as it is made: the shape, the algorithm kept, and the sustained milliseconds a
// call of it and of the default.
struct SustainedChoiceMade {
  std::string shape, algorithm;
  double kept_ms = 0.0, default_ms = 0.0;
};

// The chooser of a search: each GEMM's default, cuBLASLt's first kSustainedCandidates and
// the configurations near them, chosen under sustained load, stored in `file` and written
// to `path` (for `machine`) as each is made, tens of seconds apart, so that a search that
// stops resumes. A shape the file already holds keeps its choice and is not timed.
class SustainedChooser final : public GemmChooser {
 public:
  using Report = std::function<void(const SustainedChoiceMade&)>;
  SustainedChooser(GemmChoiceFile& file, std::string path, std::string machine, SustainedTiming timing = {},
                   Report report = nullptr);
  std::optional<std::string> choose(const GemmToChoose& gemm) override;
  // Shapes timed by this chooser (not those the file held).
  int searched() const { return searched_; }

 private:
  GemmChoiceFile& file_;
  std::string path_, machine_;
  SustainedTiming timing_;
  Report report_;
  int searched_ = 0;
};

}  // namespace scalestudy::cuda
