#include "lt_algorithms.cuh"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <sstream>
#include <utility>

#include "cuda_check.h"
#include "gemm_sustained.cuh"

namespace scalestudy::cuda {
namespace {

// The configuration attributes lt_algorithm_config writes, in its order, with its labels.
constexpr std::pair<cublasLtMatmulAlgoConfigAttributes_t, const char*> kConfigAttributes[] = {
    {CUBLASLT_ALGO_CONFIG_ID, "id"},
    {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile"},
    {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages"},
    {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "splitk"},
    {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "reduction"},
    {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "swizzle"},
    {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "custom"},
    {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, "inner"},
    {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "cluster"}};

// Each attribute has its own width (16, 32 or 64 bits), which cuBLASLt gives when asked;
// values go through the low bytes of a 64-bit integer (the GPUs' hosts are little-endian).
size_t config_width(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  size_t width = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &width));
  return width;
}

uint64_t config_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  uint64_t value = 0;
  size_t width = config_width(algo, attribute);
  CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, width, &width));
  return value;
}

cublasStatus_t set_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute,
                          uint64_t value) {
  return cublasLtMatmulAlgoConfigSetAttribute(&algo, attribute, &value, config_width(algo, attribute));
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
    cublasLtMatmulAlgo_t algo,
    std::initializer_list<std::pair<cublasLtMatmulAlgoConfigAttributes_t, uint64_t>> values) {
  for (const auto& [attribute, value] : values)
    if (set_config(algo, attribute, value) != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  return algo;
}

uint32_t custom_option_max(const cublasLtMatmulAlgo_t& algo) {
  return static_cast<uint32_t>(capability(algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX));
}

bool accepted(const LtProblem& problem, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(problem.handle, problem.desc, problem.a, problem.b, problem.c, problem.c, &algo,
                                 &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= problem.workspace_bytes;
}

// The configurations tried so far, each with its burst time; the heuristic's candidates are
// tried too, as starting points, but are never returned.
class NeighbourSearch {
 public:
  NeighbourSearch(const LtProblem& problem, cudaStream_t stream, const LtLaunch& launch)
      : problem_(problem), stream_(stream), launch_(launch) {}

  // Times the algorithm once if it is new and accepted.
  void try_algorithm(const cublasLtMatmulAlgo_t& algo, bool is_candidate) {
    if (!seen_.insert(lt_algorithm_config(algo)).second || !accepted(problem_, algo)) return;
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

}  // namespace

std::vector<cublasLtMatmulAlgo_t> lt_candidates(const LtProblem& problem, int count) {
  cublasLtMatmulPreference_t preference = nullptr;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t max_workspace = problem.workspace_bytes;
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &max_workspace, sizeof(max_workspace)));
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                    &reduction_mask, sizeof(reduction_mask)));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &kLtOperandAlignmentBytes,
                                                      sizeof(kLtOperandAlignmentBytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  // A refusal (no algorithm for this configuration) is an answer: no candidates.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(problem.handle, problem.desc, problem.a, problem.b,
                                                               problem.c, problem.c, preference, count,
                                                               results.data(), &found);
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(preference));
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status == CUBLAS_STATUS_SUCCESS)
    for (int index = 0; index < found; ++index) algos.push_back(results[index].algo);
  return algos;
}

std::string lt_algorithm_config(const cublasLtMatmulAlgo_t& algo) {
  std::ostringstream text;
  text << "lt";
  for (const auto& [attribute, label] : kConfigAttributes)
    text << " " << label << "=" << config_value(algo, attribute);
  return text.str();
}

std::optional<cublasLtMatmulAlgo_t> lt_algorithm_of(const LtProblem& problem, const std::string& config) {
  std::istringstream text(config);
  std::string word;
  if (!(text >> word) || word != "lt") return std::nullopt;
  uint64_t values[std::size(kConfigAttributes)] = {};
  for (size_t index = 0; index < std::size(kConfigAttributes); ++index) {
    const std::string label = std::string(kConfigAttributes[index].second) + "=";
    if (!(text >> word) || word.rfind(label, 0) != 0) return std::nullopt;
    std::istringstream number(word.substr(label.size()));
    if (!(number >> values[index]) || !number.eof()) return std::nullopt;
  }
  if (text >> word) return std::nullopt;  // more than a configuration
  cublasLtMatmulAlgo_t algo{};
  if (cublasLtMatmulAlgoInit(problem.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, problem.ab_type, problem.ab_type,
                             problem.c_type, problem.c_type, static_cast<int>(values[0]),
                             &algo) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  for (size_t index = 1; index < std::size(kConfigAttributes); ++index)
    if (set_config(algo, kConfigAttributes[index].first, values[index]) != CUBLAS_STATUS_SUCCESS)
      return std::nullopt;
  if (!accepted(problem, algo)) return std::nullopt;
  return algo;
}

std::vector<cublasLtMatmulAlgo_t> lt_neighbours(const LtProblem& problem,
                                                const std::vector<cublasLtMatmulAlgo_t>& candidates,
                                                cudaStream_t stream, const LtLaunch& launch) {
  NeighbourSearch search(problem, stream, launch);
  for (const cublasLtMatmulAlgo_t& candidate : candidates) search.try_algorithm(candidate, true);
  // The first pass: every tile and custom option of each kind of candidate (its algorithm,
  // stages and split-K), in the first such candidate's cluster shape and swizzling.
  std::set<std::string> kinds;
  for (const cublasLtMatmulAlgo_t& candidate : candidates) {
    std::ostringstream kind;
    for (const auto attribute : {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                 CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME})
      kind << config_value(candidate, attribute) << " ";
    if (!kinds.insert(kind.str()).second) continue;
    const uint32_t custom_max = custom_option_max(candidate);
    for (uint32_t tile : capability_list(candidate, CUBLASLT_ALGO_CAP_TILE_IDS))
      for (uint32_t custom = 0; custom <= custom_max; ++custom)
        if (const auto algo = with_config(candidate, {{CUBLASLT_ALGO_CONFIG_TILE_ID, tile},
                                                      {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom}}))
          search.try_algorithm(*algo, false);
  }
  // The second pass: each cluster shape of up to 2 x 2, swizzling and custom option of the
  // fastest. The custom option goes again with the cluster shape: the best configuration of
  // a tile in one cluster shape may take another custom option than in the first pass's.
  constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
  for (const cublasLtMatmulAlgo_t& base : search.fastest(kNeighbourTiles, true)) {
    const uint32_t swizzle_max = capability(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0 ? 1 : 0;
    const uint32_t custom_max = custom_option_max(base);
    for (uint16_t cluster : kClusters)
      for (uint32_t swizzle = 0; swizzle <= swizzle_max; ++swizzle)
        for (uint32_t custom = 0; custom <= custom_max; ++custom)
          if (const auto algo = with_config(base, {{CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster},
                                                   {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle},
                                                   {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom}}))
            search.try_algorithm(*algo, false);
  }
  return search.fastest(kNeighbourConfigurations, false);
}

}  // namespace scalestudy::cuda
