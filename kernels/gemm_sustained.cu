#include "gemm_sustained.cuh"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <utility>

#include "cuda_check.h"

namespace scalestudy::cuda {
namespace {

size_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

bool is_16bit(cudaDataType_t type) { return type == CUDA_R_16BF || type == CUDA_R_16F; }

// Milliseconds a call of `launch` run back to back for kSustainedWindowMs, after
// kSustainedLeadMs of it untimed; negative where cuBLAS refuses it.
double sustained_ms(cudaStream_t stream, const GemmLaunch& launch) {
  if (launch() != CUBLAS_STATUS_SUCCESS) return -1.0;
  constexpr int kProbeCalls = 3;
  const double probe_ms = std::max(timed_ms(stream, launch, kProbeCalls) / kProbeCalls, 1e-3);
  const auto calls_for = [&](double ms) { return std::max(kProbeCalls, static_cast<int>(ms / probe_ms)); };
  for (int call = 0, lead = calls_for(kSustainedLeadMs); call < lead; ++call) CHECK_CUBLAS(launch());
  const int calls = calls_for(kSustainedWindowMs);
  return timed_ms(stream, launch, calls) / calls;
}

// A candidate's name in a run's summary: "cuBLASLt's #<index>" for the heuristic's first
// `offered`, the configuration for the ones near them.
std::string candidate_name(const std::vector<cublasLtMatmulAlgo_t>& candidates, int index, int offered) {
  if (index < offered) return "cuBLASLt's #" + std::to_string(index);
  return "the configuration near them " + lt_algorithm_config(candidates[index]);
}

// "<kept>, <ms> ms a call sustained; <default>: <ms>" for a run's summary.
std::string describe_sustained(const SustainedChoice& choice, const std::vector<std::string>& names) {
  std::ostringstream text;
  text.precision(4);
  const auto ms_of = [&](int index) {
    std::ostringstream ms;
    ms.precision(4);
    if (choice.ms[index] < 0.0) ms << "refused";
    else ms << choice.ms[index] << " ms";
    return ms.str();
  };
  text << names[choice.kept] << ", " << ms_of(choice.kept) << " a call sustained";
  if (choice.kept != 0) text << "; " << names[0] << ": " << ms_of(0);
  return text.str();
}

}  // namespace

double timed_ms(cudaStream_t stream, const GemmLaunch& launch, int calls) {
  cudaEvent_t begin = nullptr, end = nullptr;
  CHECK_CUDA(cudaEventCreate(&begin));
  CHECK_CUDA(cudaEventCreate(&end));
  CHECK_CUDA(cudaEventRecord(begin, stream));
  for (int call = 0; call < calls; ++call) CHECK_CUBLAS(launch());
  CHECK_CUDA(cudaEventRecord(end, stream));
  CHECK_CUDA(cudaEventSynchronize(end));
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, begin, end));
  CHECK_CUDA(cudaEventDestroy(begin));
  CHECK_CUDA(cudaEventDestroy(end));
  return ms;
}

SustainedChoice choose_sustained(cudaStream_t stream, const std::vector<GemmLaunch>& launches) {
  SustainedChoice choice;
  for (const GemmLaunch& launch : launches) choice.ms.push_back(sustained_ms(stream, launch));
  int fastest = -1;
  for (int index = 0; index < static_cast<int>(launches.size()); ++index)
    if (choice.ms[index] >= 0.0 && (fastest < 0 || choice.ms[index] < choice.ms[fastest])) fastest = index;
  if (fastest <= 0) return choice;  // the default is the fastest, or nothing ran
  if (choice.ms[0] < 0.0) {
    choice.kept = fastest;  // the default was refused
    return choice;
  }
  // Once more each, the fastest first: the mean of two runs against the mean of two.
  choice.ms[fastest] = (choice.ms[fastest] + sustained_ms(stream, launches[fastest])) / 2;
  choice.ms[0] = (choice.ms[0] + sustained_ms(stream, launches[0])) / 2;
  const double required = 1.0 - kSustainedRequiredGainPercent / 100.0;
  if (choice.ms[fastest] <= required * choice.ms[0]) choice.kept = fastest;
  return choice;
}

SustainedPick pick_sustained(const SustainedSearch& search) {
  std::vector<cublasLtMatmulAlgo_t>& candidates = *search.candidates;
  const int offered = static_cast<int>(candidates.size());
  for (const cublasLtMatmulAlgo_t& algo : lt_neighbours(search.problem, candidates, search.stream, search.launch))
    candidates.push_back(algo);
  const bool has_fallback = static_cast<bool>(search.fallback);
  std::vector<GemmLaunch> launches;
  std::vector<std::string> names;
  if (has_fallback) {
    launches.push_back(search.fallback);
    names.push_back(search.fallback_name);
  }
  for (int index = 0; index < static_cast<int>(candidates.size()); ++index) {
    launches.push_back([&, index] { return search.launch(candidates[index]); });
    names.push_back(!has_fallback && index == 0 ? std::string("cuBLASLt's first")
                                                : candidate_name(candidates, index, offered));
  }
  const SustainedChoice choice = choose_sustained(search.stream, launches);
  return {choice.kept - (has_fallback ? 1 : 0), describe_sustained(choice, names)};
}

std::string gemm_machine(int device) {
  cudaDeviceProp properties{};
  CHECK_CUDA(cudaGetDeviceProperties(&properties, device));
  return std::string(properties.name) + " | cuBLASLt " + std::to_string(cublasLtGetVersion());
}

bool run_tuned_gemm(GemmTuner& tuner, cublasHandle_t handle, const GemmArgs& g) {
  return tuner.run(handle, g);
}

GemmTuner::GemmTuner(GemmChoiceFile* file) : file_(file) {
  CHECK_CUBLAS(cublasLtCreate(&handle_));
  CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
}

GemmTuner::~GemmTuner() {
  for (auto& [key, plan] : plans_) {
    for (cublasLtMatrixLayout_t layout : {plan.a, plan.b, plan.c})
      if (layout) CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(layout));
    if (plan.desc) CHECK_CUBLAS(cublasLtMatmulDescDestroy(plan.desc));
  }
  CHECK_CUDA(cudaFree(workspace_));
  CHECK_CUBLAS(cublasLtDestroy(handle_));
}

bool GemmTuner::run(cublasHandle_t handle, const GemmArgs& g) {
  const bool c_type_taken = g.types.c == g.types.ab || g.types.c == CUDA_R_32F;
  const bool leading_dims_aligned = g.a.ld * element_bytes(g.types.ab) % kLtOperandAlignmentBytes == 0 &&
                                    g.b.ld * element_bytes(g.types.ab) % kLtOperandAlignmentBytes == 0 &&
                                    g.c.ld * element_bytes(g.types.c) % kLtOperandAlignmentBytes == 0;
  const bool operands_aligned = lt_aligned(g.a.data) && lt_aligned(g.b.data) && lt_aligned(g.c.data);
  if (g.batch_count != 1 || g.alpha != 1.0f || !is_16bit(g.types.ab) || !c_type_taken ||
      !leading_dims_aligned || !operands_aligned)
    return false;
  const Key key{g.op_a, g.op_b, g.m, g.n, g.k, g.a.ld, g.b.ld, g.c.ld, g.types.ab, g.types.c, g.beta != 0.0f,
                multiprocessor_target_};
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(handle, &stream));
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    found = plans_.emplace(key, make_plan(g)).first;
    choose(found->second, handle, stream, g);
  }
  const Plan& plan = found->second;
  if (plan.kept < 0) return false;
  CHECK_CUBLAS(launch(plan, plan.candidates[plan.kept], stream, g));
  return true;
}

// Column-major, as cuBLAS: A is m x k (op N) or k x m (op T), B is k x n or n x k.
GemmTuner::Plan GemmTuner::make_plan(const GemmArgs& g) const {
  Plan plan;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  for (const auto& [attribute, op] : {std::pair{CUBLASLT_MATMUL_DESC_TRANSA, g.op_a},
                                      std::pair{CUBLASLT_MATMUL_DESC_TRANSB, g.op_b}})
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, attribute, &op, sizeof(op)));
  if (multiprocessor_target_ > 0)
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                &multiprocessor_target_, sizeof(multiprocessor_target_)));
  const bool a_plain = g.op_a == CUBLAS_OP_N, b_plain = g.op_b == CUBLAS_OP_N;
  const auto layout = [](cublasLtMatrixLayout_t* made, cudaDataType_t type, bool plain, int rows, int columns,
                         int ld) {
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(made, type, plain ? rows : columns, plain ? columns : rows, ld));
  };
  layout(&plan.a, g.types.ab, a_plain, g.m, g.k, g.a.ld);
  layout(&plan.b, g.types.ab, b_plain, g.k, g.n, g.b.ld);
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.c, g.types.c, g.m, g.n, g.c.ld));
  plan.candidates = lt_candidates(problem_of(plan, g), kSustainedCandidates);
  return plan;
}

LtProblem GemmTuner::problem_of(const Plan& plan, const GemmArgs& g) const {
  return {handle_, plan.desc, plan.a, plan.b, plan.c, g.types.ab, g.types.c, kWorkspaceBytes};
}

cublasStatus_t GemmTuner::launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, cudaStream_t stream,
                                 const GemmArgs& g) const {
  return cublasLtMatmul(handle_, plan.desc, &g.alpha, g.a.data, plan.a, g.b.data, plan.b, &g.beta, g.c.data,
                        plan.c, g.c.data, plan.c, &algo, workspace_, kWorkspaceBytes, stream);
}

std::string GemmTuner::shape_of(const GemmArgs& g) const {
  std::ostringstream shape;
  shape << "plain " << (g.types.ab == CUDA_R_16BF ? "bf16" : "fp16") << " m=" << g.m << " n=" << g.n
        << " k=" << g.k << " lda=" << g.a.ld << " ldb=" << g.b.ld << " ldc=" << g.c.ld << " op "
        << (g.op_a == CUBLAS_OP_N ? 'N' : 'T') << (g.op_b == CUBLAS_OP_N ? 'N' : 'T')
        << (g.types.c == CUDA_R_32F ? ", fp32 out" : "") << (g.beta != 0.0f ? ", adds" : "");
  if (multiprocessor_target_ > 0) shape << " on " << multiprocessor_target_ << " multiprocessors";
  return shape.str();
}

void GemmTuner::choose(Plan& plan, cublasHandle_t handle, cudaStream_t stream, const GemmArgs& g) {
  const std::string shape = shape_of(g);
  if (plan.candidates.empty()) {
    plan.choice = shape + ": cuBLAS's own (cuBLASLt offers no other)";
    return;
  }
  const std::optional<std::string> kept = file_ != nullptr ? file_->find(shape) : std::nullopt;
  const std::optional<cublasLtMatmulAlgo_t> algo =
      kept && *kept != "cublas" ? lt_algorithm_of(problem_of(plan, g), *kept) : std::nullopt;
  if (kept && (*kept == "cublas" || algo)) {
    if (algo) plan.candidates.push_back(*algo);
    plan.kept = algo ? static_cast<int>(plan.candidates.size()) - 1 : -1;
    plan.choice = shape + ": " + (algo ? *kept : "cuBLAS's own") + ", as --gemm-algos-file keeps it";
    return;
  }
  const bool timed = time_candidates(plan, handle, stream, g);
  plan.choice = shape + ": " + plan.choice;
  if (timed && file_ != nullptr)
    file_->store(shape, plan.kept < 0 ? "cublas" : lt_algorithm_config(plan.candidates[plan.kept]));
}

// Times cuBLAS's own and each candidate on g's operands. A GEMM that adds to its output is
// timed on it, then given it back as it was; without the memory to keep a copy, cuBLAS's
// own stays.
bool GemmTuner::time_candidates(Plan& plan, cublasHandle_t handle, cudaStream_t stream, const GemmArgs& g) {
  void* saved = nullptr;
  const size_t c_bytes = (size_t(g.c.ld) * (g.n - 1) + g.m) * element_bytes(g.types.c);
  if (g.beta != 0.0f) {
    if (cudaMalloc(&saved, c_bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // the failed allocation leaves no error behind
      plan.choice = "cuBLAS's own (no memory to keep the output while timing)";
      return false;
    }
    CHECK_CUDA(cudaMemcpyAsync(saved, g.c.data, c_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  const SustainedPick pick = pick_sustained(
      {problem_of(plan, g), &plan.candidates, stream,
       [&](const cublasLtMatmulAlgo_t& algo) { return launch(plan, algo, stream, g); },
       [&] { return cublas_gemm(handle, g); }, "cuBLAS's own"});
  plan.kept = pick.kept;
  plan.choice = pick.description;
  if (saved != nullptr) {
    CHECK_CUDA(cudaMemcpyAsync(g.c.data, saved, c_bytes, cudaMemcpyDeviceToDevice, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaFree(saved));
  }
  return true;
}

std::vector<std::string> GemmTuner::algorithm_report() const {
  std::vector<std::string> lines;
  for (const auto& [key, plan] : plans_) lines.push_back(plan.choice);
  return lines;
}

}  // namespace scalestudy::cuda
