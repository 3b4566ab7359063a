#include "gemm_search.cuh"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "gemm_lt.cuh"

namespace scalestudy::cuda {
namespace {

// Milliseconds a call of `launch` run back to back for the timing's window, after its lead
// untimed; negative where cuBLAS refuses it.
double sustained_ms(cudaStream_t stream, const GemmLaunch& launch, const SustainedTiming& timing) {
  if (launch() != CUBLAS_STATUS_SUCCESS) return -1.0;
  constexpr int kProbeCalls = 3;
  const double probe_ms = std::max(timed_ms(stream, launch, kProbeCalls) / kProbeCalls, 1e-3);
  const auto calls_for = [&](double ms) { return std::max(kProbeCalls, static_cast<int>(ms / probe_ms)); };
  for (int call = 0, lead = calls_for(timing.lead_ms); call < lead; ++call) CHECK_CUBLAS(launch());
  const int calls = calls_for(timing.window_ms);
  return timed_ms(stream, launch, calls) / calls;
}

// Which of `launches` to keep, launches[0] being the default, and each one's sustained
// milliseconds a call (negative where it was refused; the mean of two runs for the default
// and the fastest). Runs every launch many times: their outputs must be safe to overwrite.
struct SustainedChoice {
  int kept = 0;
  std::vector<double> ms;
};
SustainedChoice choose_sustained(cudaStream_t stream, const std::vector<GemmLaunch>& launches,
                                 const SustainedTiming& timing) {
  SustainedChoice choice;
  for (const GemmLaunch& launch : launches) choice.ms.push_back(sustained_ms(stream, launch, timing));
  int fastest = -1;
  for (int index = 0; index < static_cast<int>(launches.size()); ++index)
    if (choice.ms[index] >= 0.0 && (fastest < 0 || choice.ms[index] < choice.ms[fastest])) fastest = index;
  if (fastest <= 0) return choice;  // the default is the fastest, or nothing ran
  if (choice.ms[0] < 0.0) {
    choice.kept = fastest;  // the default was refused
    return choice;
  }
  // Once more each, the fastest first: the mean of two runs against the mean of two.
  choice.ms[fastest] = (choice.ms[fastest] + sustained_ms(stream, launches[fastest], timing)) / 2;
  choice.ms[0] = (choice.ms[0] + sustained_ms(stream, launches[0], timing)) / 2;
  const double required = 1.0 - kSustainedRequiredGainPercent / 100.0;
  if (choice.ms[fastest] <= required * choice.ms[0]) choice.kept = fastest;
  return choice;
}

std::vector<uint32_t> capability_list(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t cap) {
  size_t bytes = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoCapGetAttribute(&algo, cap, nullptr, 0, &bytes));
  std::vector<uint32_t> values(bytes / sizeof(uint32_t));
  if (!values.empty()) CHECK_CUBLAS(cublasLtMatmulAlgoCapGetAttribute(&algo, cap, values.data(), bytes, &bytes));
  return values;
}

int32_t capability(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t cap) {
  int32_t value = 0;
  size_t bytes = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoCapGetAttribute(&algo, cap, &value, sizeof(value), &bytes));
  return value;
}

// `algo` with each attribute set to its value; nothing where cuBLASLt refuses one.
std::optional<cublasLtMatmulAlgo_t> with_config(
    cublasLtMatmulAlgo_t algo, std::initializer_list<std::pair<cublasLtMatmulAlgoConfigAttributes_t, uint64_t>> values) {
  for (const auto& [attribute, value] : values)
    if (set_lt_config(algo, attribute, value) != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  return algo;
}

// The configurations tried so far, each with its burst time; the heuristic's candidates are
// tried too, as starting points, but are never returned.
class NeighbourSearch {
 public:
  NeighbourSearch(const LtProblem& problem, cudaStream_t stream, const LtLaunch& launch)
      : problem_(problem), stream_(stream), launch_(launch) {}

  // Times the algorithm once if it is new and cuBLASLt accepts it.
  void try_algorithm(const cublasLtMatmulAlgo_t& algo, bool is_candidate) {
    const std::string config = lt_algorithm_config(algo);
    if (!seen_.insert(config).second || !lt_algorithm_of(problem_, config)) return;
    if (launch_(algo) != CUBLAS_STATUS_SUCCESS) return;  // accepted, yet refused at launch
    const double ms = timed_ms(stream_, [&] { return launch_(algo); }, 1);
    tried_.push_back({ms, algo, is_candidate});
  }
  // The `count` fastest so far, candidates included or not.
  std::vector<cublasLtMatmulAlgo_t> fastest(size_t count, bool candidates_too) {
    std::stable_sort(tried_.begin(), tried_.end(), [](const Tried& x, const Tried& y) { return x.ms < y.ms; });
    std::vector<cublasLtMatmulAlgo_t> algos;
    for (const Tried& tried : tried_)
      if (algos.size() < count && (candidates_too || !tried.is_candidate)) algos.push_back(tried.algo);
    return algos;
  }

 private:
  struct Tried {
    double ms;
    cublasLtMatmulAlgo_t algo;
    bool is_candidate;
  };
  const LtProblem& problem_;
  cudaStream_t stream_;
  const LtLaunch& launch_;
  std::set<std::string> seen_;
  std::vector<Tried> tried_;
};

// First pass: every tile and custom option of each kind of candidate (algorithm, stages,
// split-K).
void try_tiles(NeighbourSearch& search, const std::vector<cublasLtMatmulAlgo_t>& candidates) {
  std::set<std::string> kinds;
  for (const cublasLtMatmulAlgo_t& candidate : candidates) {
    std::ostringstream kind;
    for (const auto attribute : {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                 CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME})
      kind << lt_config_value(candidate, attribute) << " ";
    if (!kinds.insert(kind.str()).second) continue;
    const auto custom_max = static_cast<uint32_t>(capability(candidate, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX));
    for (uint32_t tile : capability_list(candidate, CUBLASLT_ALGO_CAP_TILE_IDS))
      for (uint32_t custom = 0; custom <= custom_max; ++custom)
        if (const auto algo = with_config(candidate, {{CUBLASLT_ALGO_CONFIG_TILE_ID, tile},
                                                      {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom}}))
          search.try_algorithm(*algo, false);
  }
}

// Second pass, around the fastest so far: every cluster shape up to 2 x 2, swizzling and
// custom option. The custom option goes again with the cluster shape: the best
// configuration of a tile in one cluster shape may take another custom option.
void try_clusters(NeighbourSearch& search) {
  constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
  for (const cublasLtMatmulAlgo_t& base : search.fastest(kNeighbourTiles, true)) {
    const uint32_t swizzle_max = capability(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0 ? 1 : 0;
    const auto custom_max = static_cast<uint32_t>(capability(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX));
    for (uint16_t cluster : kClusters)
      for (uint32_t swizzle = 0; swizzle <= swizzle_max; ++swizzle)
        for (uint32_t custom = 0; custom <= custom_max; ++custom)
          if (const auto algo = with_config(base, {{CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster},
                                                   {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle},
                                                   {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom}}))
            search.try_algorithm(*algo, false);
  }
}

}  // namespace

std::vector<cublasLtMatmulAlgo_t> lt_neighbours(const LtProblem& problem,
                                                const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                                cudaStream_t stream, const LtLaunch& launch) {
  NeighbourSearch search(problem, stream, launch);
  for (const cublasLtMatmulAlgo_t& candidate : candidates) search.try_algorithm(candidate, true);
  try_tiles(search, candidates);
  try_clusters(search);
  return search.fastest(kNeighbourConfigurations, false);
}

SustainedChooser::SustainedChooser(GemmChoiceFile& file, std::string path, std::string machine,
                                   SustainedTiming timing, Report report)
    : file_(file), path_(std::move(path)), machine_(std::move(machine)), timing_(timing), report_(std::move(report)) {}

std::optional<std::string> SustainedChooser::choose(const GemmToChoose& gemm) {
  if (const auto kept = file_.find(gemm.shape)) return kept;
  std::vector<cublasLtMatmulAlgo_t> candidates = lt_candidates(gemm.problem, kSustainedCandidates);
  const std::vector<cublasLtMatmulAlgo_t> near = lt_neighbours(gemm.problem, candidates, gemm.stream, gemm.launch);
  candidates.insert(candidates.end(), near.begin(), near.end());
  std::vector<GemmLaunch> launches{gemm.fallback};
  for (const cublasLtMatmulAlgo_t& algo : candidates) launches.push_back([&gemm, algo] { return gemm.launch(algo); });
  const SustainedChoice choice = choose_sustained(gemm.stream, launches, timing_);
  const std::string kept = choice.kept != 0 ? lt_algorithm_config(candidates[choice.kept - 1])
                           : gemm.plain     ? std::string("cublas")
                                            : lt_algorithm_config(lt_candidates(gemm.problem, 1).at(0));
  file_.store(gemm.shape, kept);
  file_.write(path_, machine_);
  ++searched_;
  if (report_) report_({gemm.shape, kept, choice.ms[choice.kept], choice.ms[0]});
  return kept;
}

}  // namespace scalestudy::cuda
