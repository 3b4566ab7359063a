#include "gemm_choice_file.cuh"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "cuda_check.h"

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

size_t config_width(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  size_t width = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &width));
  return width;
}

bool accepted(const LtProblem& problem, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(problem.handle, problem.desc, problem.a, problem.b, problem.c, problem.c, &algo,
                                 &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= problem.workspace_bytes;
}

constexpr const char* kHeaderPrefix = "scalestudy gemm algorithms for ";

bool one_field(const std::string& text) {
  return !text.empty() && text.find_first_of("\t\n\r") == std::string::npos;
}

}  // namespace

uint64_t lt_config_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  uint64_t value = 0;  // the GPUs' hosts are little-endian
  size_t width = config_width(algo, attribute);
  CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, width, &width));
  return value;
}

cublasStatus_t set_lt_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute,
                             uint64_t value) {
  return cublasLtMatmulAlgoConfigSetAttribute(&algo, attribute, &value, config_width(algo, attribute));
}

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
  for (const auto& [attribute, label] : kConfigAttributes) text << " " << label << "=" << lt_config_value(algo, attribute);
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
    if (set_lt_config(algo, kConfigAttributes[index].first, values[index]) != CUBLAS_STATUS_SUCCESS)
      return std::nullopt;
  if (!accepted(problem, algo)) return std::nullopt;
  return algo;
}

std::string gemm_machine(int device) {
  cudaDeviceProp properties{};
  CHECK_CUDA(cudaGetDeviceProperties(&properties, device));
  return std::string(properties.name) + " | cuBLASLt " + std::to_string(cublasLtGetVersion());
}

GemmChoiceFile GemmChoiceFile::read(const std::string& path, const std::string& machine) {
  GemmChoiceFile file;
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot be read");
  std::string line;
  if (!std::getline(in, line) || line.rfind(kHeaderPrefix, 0) != 0)
    throw std::invalid_argument(path + ": line 1 must be \"" + kHeaderPrefix + "<machine>\"");
  const std::string made_for = line.substr(std::string(kHeaderPrefix).size());
  if (made_for != machine) {
    file.set_aside_because_ = path + " was made for " + made_for + ", this is " + machine;
    return file;
  }
  for (int number = 2; std::getline(in, line); ++number) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || tab + 1 == line.size() || line.find('\t', tab + 1) != std::string::npos)
      throw std::invalid_argument(path + ": line " + std::to_string(number) + " must be <shape><TAB><algorithm>");
    file.choices_[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return file;
}

std::optional<std::string> GemmChoiceFile::find(const std::string& shape) const {
  const auto found = choices_.find(shape);
  if (found == choices_.end()) return std::nullopt;
  return found->second;
}

void GemmChoiceFile::store(const std::string& shape, const std::string& algorithm) {
  if (!one_field(shape) || !one_field(algorithm))
    throw std::invalid_argument("a GEMM choice's shape and algorithm are one field each: '" + shape + "', '" +
                                algorithm + "'");
  choices_[shape] = algorithm;
}

void GemmChoiceFile::write(const std::string& path, const std::string& machine) const {
  // Unique to this process among the processes of every node that may share the file.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string temporary = path + ".tmp." + host + "." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << kHeaderPrefix << machine << "\n";
    for (const auto& [shape, algorithm] : choices_) out << shape << "\t" << algorithm << "\n";
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename " + temporary + " to " + path);
}

}  // namespace scalestudy::cuda
