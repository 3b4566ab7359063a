#include "gemm_sustained.cuh"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <utility>

#include "cuda_check.h"

namespace scalestudy::cuda {
namespace {

constexpr uintptr_t kOperandAlignment = 16;

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kOperandAlignment == 0; }

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

std::string lt_algorithm_config(const cublasLtMatmulAlgo_t& algo) {
  const std::pair<cublasLtMatmulAlgoConfigAttributes_t, const char*> attributes[] = {
      {CUBLASLT_ALGO_CONFIG_ID, "id"},
      {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile"},
      {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages"},
      {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "splitk"},
      {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "reduction"},
      {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "swizzle"},
      {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "custom"},
      {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, "inner"},
      {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "cluster"}};
  std::ostringstream text;
  text << "lt";
  for (const auto& [attribute, label] : attributes) {
    // Each attribute has its own width (16, 32 or 64 bits): asked first, then read.
    uint64_t value = 0;
    size_t width = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &width));
    CHECK_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, width, &width));
    text << " " << label << "=" << value;
  }
  return text.str();
}

int find_lt_algorithm(const std::vector<cublasLtMatmulAlgo_t>& candidates, const std::string& config) {
  for (int index = 0; index < static_cast<int>(candidates.size()); ++index)
    if (lt_algorithm_config(candidates[index]) == config) return index;
  return -1;
}

std::string gemm_machine(int device) {
  cudaDeviceProp properties{};
  CHECK_CUDA(cudaGetDeviceProperties(&properties, device));
  return std::string(properties.name) + " | cuBLASLt " + std::to_string(cublasLtGetVersion());
}

std::vector<cublasLtMatmulAlgo_t> lt_candidates(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                cublasLtMatrixLayout_t c, size_t workspace_bytes,
                                                int count) {
  cublasLtMatmulPreference_t preference = nullptr;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t max_workspace = workspace_bytes;
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint32_t alignment = kOperandAlignment;
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &max_workspace, sizeof(max_workspace)));
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                    &reduction_mask, sizeof(reduction_mask)));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  // A refusal (no algorithm for this configuration) is an answer: no candidates.
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, preference, count, results.data(), &found);
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(preference));
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status == CUBLAS_STATUS_SUCCESS)
    for (int index = 0; index < found; ++index) algos.push_back(results[index].algo);
  return algos;
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
  const bool leading_dims_aligned = g.a.ld * element_bytes(g.types.ab) % kOperandAlignment == 0 &&
                                    g.b.ld * element_bytes(g.types.ab) % kOperandAlignment == 0 &&
                                    g.c.ld * element_bytes(g.types.c) % kOperandAlignment == 0;
  const bool operands_aligned = aligned(g.a.data) && aligned(g.b.data) && aligned(g.c.data);
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
  CHECK_CUBLAS(launch(plan, plan.kept, stream, g));
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
  plan.candidates =
      lt_candidates(handle_, plan.desc, plan.a, plan.b, plan.c, kWorkspaceBytes, kSustainedCandidates);
  return plan;
}

cublasStatus_t GemmTuner::launch(const Plan& plan, int candidate, cudaStream_t stream,
                                 const GemmArgs& g) const {
  return cublasLtMatmul(handle_, plan.desc, &g.alpha, g.a.data, plan.a, g.b.data, plan.b, &g.beta, g.c.data,
                        plan.c, g.c.data, plan.c, &plan.candidates[candidate], workspace_, kWorkspaceBytes,
                        stream);
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
  const int index = kept && *kept != "cublas" ? find_lt_algorithm(plan.candidates, *kept) : -1;
  if (kept && (*kept == "cublas" || index >= 0)) {
    plan.kept = index;
    plan.choice = shape + ": " + (index < 0 ? "cuBLAS's own" : "cuBLASLt's #" + std::to_string(index)) +
                  ", as --gemm-algos-file keeps it";
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
  std::vector<GemmLaunch> launches{[&] { return cublas_gemm(handle, g); }};
  std::vector<std::string> names{"cuBLAS's own"};
  for (int index = 0; index < static_cast<int>(plan.candidates.size()); ++index) {
    launches.push_back([&, index] { return launch(plan, index, stream, g); });
    names.push_back("cuBLASLt's #" + std::to_string(index));
  }
  const SustainedChoice choice = choose_sustained(stream, launches);
  plan.kept = choice.kept - 1;
  plan.choice = describe_sustained(choice, names);
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
