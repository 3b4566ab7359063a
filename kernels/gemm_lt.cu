#include "gemm_lt.cuh"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>

#include "common.cuh"
#include "cuda_check.h"
#include "gemm_sustained.cuh"

namespace scalestudy::cuda {
namespace {

// 16-bit columns of a multiple of 8 elements keep every column 16-byte aligned.
constexpr int kAlignedColumns = 8;
constexpr long long kMaxOperandElems = (1LL << 31) - 1;

template <class Value>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const Value& value) {
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// Leading dimensions a multiple of 8 and no operand of 2^31 elements or more.
bool shape_allowed(int m, int n, int k) {
  const auto elems = [](int rows, int columns) { return static_cast<long long>(rows) * columns; };
  return m % kAlignedColumns == 0 && k % kAlignedColumns == 0 && elems(m, n) <= kMaxOperandElems &&
         elems(k, n) <= kMaxOperandElems && elems(m, k) <= kMaxOperandElems;
}

// Timed and sustained choices, one per device, way of choosing, epilogue, type, shape and
// multiprocessor target, shared by every EpilogueGemm of the process: whether the sizing for fewer
// multiprocessors was kept (timed), the report, and which algorithm was kept (sustained).
using ChoiceKey = std::tuple<int, int, int, int, int, int, int, int>;
struct ProcessChoice {
  bool fewer_kept = false;
  std::string description;
  cublasLtMatmulAlgo_t algo{};
};
std::mutex process_choices_mutex;
std::map<ChoiceKey, ProcessChoice> process_choices;

// The process's choice for `key`, made by `make` where it has none. The lock is held while
// `make` times, so that two threads of a process never time the same plan at once.
template <class Make>
const ProcessChoice& process_choice(const ChoiceKey& key, Make make) {
  std::lock_guard<std::mutex> lock(process_choices_mutex);
  auto earlier = process_choices.find(key);
  if (earlier == process_choices.end()) earlier = process_choices.emplace(key, make()).first;
  return earlier->second;  // entries are never erased, so the reference stays valid
}

constexpr int kTimedTrials = 5;
constexpr int kCallsPerTrial = 3;

}  // namespace

EpilogueGemm::EpilogueGemm(AlgorithmChoice choice, GemmChoiceFile* file) : choice_(choice), file_(file) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&device_multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUBLAS(cublasLtCreate(&handle_));
  CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
}

EpilogueGemm::~EpilogueGemm() {
  for (Plan& plan : plans_) {
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.a_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.b_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.d_layout));
    for (Sizing* sizing : {&plan.sizing, &plan.fewer})
      if (sizing->desc) CHECK_CUBLAS(cublasLtMatmulDescDestroy(sizing->desc));
  }
  CHECK_CUDA(cudaFree(workspace_));
  CHECK_CUBLAS(cublasLtDestroy(handle_));
}

// Column-major, as gemm.cuh explains. The forwards compute out^T[OC, N] = W[OC, IC] ·
// inp^T[IC, N]: A is the row-major [OC, IC] weight seen as [IC, OC] (op T), and the bias
// runs along OC, the rows of out^T, which is what the epilogue broadcasts. The input
// gradient computes dpre^T[IC, N] = W^T[IC, OC] · dout^T[OC, N]: A is the weight as is (op
// N). The auxiliary matrix (pre^T) has D's shape and leading dimension. Split-K may reduce
// in fp32 only (the compute type), never in the 16-bit output type.
EpilogueGemm::Plan* EpilogueGemm::plan_for(Epilogue epilogue, cudaDataType_t type, int m, int n,
                                           int k) {
  for (Plan& plan : plans_)
    if (plan.epilogue == epilogue && plan.type == type && plan.m == m && plan.n == n &&
        plan.k == k && plan.multiprocessor_target == multiprocessor_target_)
      return plan.sizing.usable ? &plan : nullptr;
  Plan plan{epilogue, type, m, n, k, multiprocessor_target_};
  if (epilogue_is_transposed_a(epilogue))
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a_layout, type, k, m, k));
  else
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a_layout, type, m, k, m));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.b_layout, type, k, n, k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.d_layout, type, m, n, m));
  plan.sizing = size_for(plan, multiprocessor_target_);
  if (plan.sizing.usable && choice_ == AlgorithmChoice::timed && multiprocessor_target_ == 0)
    plan.fewer = size_for(plan, device_multiprocessors_ - kTimedGemmFewerMultiprocessors);
  plans_.push_back(plan);
  return plans_.back().sizing.usable ? &plans_.back() : nullptr;
}

bool EpilogueGemm::epilogue_is_transposed_a(Epilogue epilogue) { return epilogue != Epilogue::dgelu; }

EpilogueGemm::Sizing EpilogueGemm::size_for(const Plan& plan, int multiprocessors) {
  Sizing sizing{multiprocessors};
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
  if (plan.epilogue == Epilogue::gelu_bias) kind = CUBLASLT_EPILOGUE_GELU_BIAS;
  if (plan.epilogue == Epilogue::gelu_aux_bias) kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (plan.epilogue == Epilogue::dgelu) kind = CUBLASLT_EPILOGUE_DGELU;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&sizing.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                cublasOperation_t{epilogue_is_transposed_a(plan.epilogue) ? CUBLAS_OP_T : CUBLAS_OP_N});
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, kind);
  if (plan.epilogue == Epilogue::gelu_aux_bias || plan.epilogue == Epilogue::dgelu)
    set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{plan.m});
  if (multiprocessors > 0)
    set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{multiprocessors});

  // A refusal (no algorithm, or a configuration this cuBLASLt does not take) is an answer,
  // not a failure: the caller falls back to the unfused kernels, and the GPU tests
  // BiasEpilogueTakesTheGpt2Shapes and GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu say
  // so where it happens.
  const int count = choice_ == AlgorithmChoice::sustained ? kSustainedCandidates : 1;
  sizing.candidates = lt_candidates(problem_of(plan, sizing), count);
  sizing.usable = !sizing.candidates.empty();
  if (sizing.usable) sizing.algo = sizing.candidates.front();
  if (choice_ != AlgorithmChoice::sustained) sizing.candidates.clear();
  return sizing;
}

EpilogueGemm::Plan* EpilogueGemm::aligned_plan_for(Epilogue epilogue, cudaDataType_t type, int m,
                                                   int n, int k,
                                                   std::initializer_list<const void*> operands) {
  for (const void* operand : operands)
    if (!lt_aligned(operand)) return nullptr;
  return shape_allowed(m, n, k) ? plan_for(epilogue, type, m, n, k) : nullptr;
}

// beta = 0, so D is only written: it is passed as C too, which cuBLASLt then never reads.
cublasStatus_t EpilogueGemm::launch(const Plan& plan, const Sizing& sizing, cudaStream_t stream,
                                    const void* a, const void* b, void* d) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle_, sizing.desc, &alpha, a, plan.a_layout, b, plan.b_layout, &beta, d,
                        plan.d_layout, d, plan.d_layout, &sizing.algo, workspace_, kWorkspaceBytes,
                        stream);
}

void EpilogueGemm::run(Plan& plan, cudaStream_t stream, const void* a, const void* b, void* d) {
  if (!plan.chosen) choose_sizing(plan, stream, a, b, d);
  CHECK_CUBLAS(launch(plan, plan.sizing, stream, a, b, d));
}

double EpilogueGemm::time_sizing(const Plan& plan, const Sizing& sizing, cudaStream_t stream,
                                 const void* a, const void* b, void* d) {
  // An algorithm the heuristic offered may still be refused at launch: it then does not run.
  if (launch(plan, sizing, stream, a, b, d) != CUBLAS_STATUS_SUCCESS) return -1.0;
  const GemmLaunch call = [&] { return launch(plan, sizing, stream, a, b, d); };
  std::vector<double> trials;
  for (int trial = 0; trial < kTimedTrials; ++trial)
    trials.push_back(timed_ms(stream, call, kCallsPerTrial) / kCallsPerTrial);
  std::sort(trials.begin(), trials.end());
  return trials[trials.size() / 2];
}

void EpilogueGemm::choose_sizing(Plan& plan, cudaStream_t stream, const void* a, const void* b,
                                 void* d) {
  plan.chosen = true;
  plan.choice = "cuBLASLt's first";
  if (plan.fewer.usable) keep_faster_sizing(plan, stream, a, b, d);
  if (plan.sizing.candidates.size() > 1) keep_sustained_candidate(plan, stream, a, b, d);
  plan.sizing.candidates.clear();
  if (plan.fewer.desc) CHECK_CUBLAS(cublasLtMatmulDescDestroy(plan.fewer.desc));
  plan.fewer = Sizing{};
}

ChoiceKey EpilogueGemm::choice_key(const Plan& plan) const {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  return {device, static_cast<int>(choice_), static_cast<int>(plan.epilogue), static_cast<int>(plan.type),
          plan.m, plan.n, plan.k, plan.multiprocessor_target};
}

void EpilogueGemm::keep_faster_sizing(Plan& plan, cudaStream_t stream, const void* a, const void* b,
                                      void* d) {
  const ProcessChoice& kept = process_choice(choice_key(plan), [&] {
    const double whole_ms = time_sizing(plan, plan.sizing, stream, a, b, d);
    const double fewer_ms = time_sizing(plan, plan.fewer, stream, a, b, d);
    SCALESTUDY_CHECK(whole_ms >= 0.0 || fewer_ms >= 0.0,
                     "cuBLASLt refused to run the algorithms its heuristic offered");
    const double required_gain = kTimedGemmRequiredGainPercent / 100.0;
    const bool fewer_kept =
        fewer_ms >= 0.0 && (whole_ms < 0.0 || fewer_ms <= (1.0 - required_gain) * whole_ms);
    std::ostringstream description;
    description.precision(4);
    description << "cuBLASLt's first for " << (fewer_kept ? plan.fewer.multiprocessors : device_multiprocessors_)
                << " multiprocessors, timed " << (fewer_kept ? fewer_ms : whole_ms) << " ms; for "
                << (fewer_kept ? device_multiprocessors_ : plan.fewer.multiprocessors) << ": ";
    const double other_ms = fewer_kept ? whole_ms : fewer_ms;
    if (other_ms < 0.0) description << "refused";
    else description << other_ms << " ms";
    return ProcessChoice{fewer_kept, description.str()};
  });
  if (kept.fewer_kept) std::swap(plan.sizing, plan.fewer);
  plan.choice = kept.description;
}

void EpilogueGemm::keep_sustained_candidate(Plan& plan, cudaStream_t stream, const void* a, const void* b,
                                            void* d) {
  std::vector<cublasLtMatmulAlgo_t>& candidates = plan.sizing.candidates;
  const LtProblem problem = problem_of(plan, plan.sizing);
  const std::string shape = shape_of(plan);
  const std::optional<std::string> in_file = file_ != nullptr ? file_->find(shape) : std::nullopt;
  const std::optional<cublasLtMatmulAlgo_t> from_file =
      in_file ? lt_algorithm_of(problem, *in_file) : std::nullopt;
  if (from_file) {
    plan.sizing.algo = *from_file;
    plan.choice = *in_file + ", as --gemm-algos-file keeps it";
    return;
  }
  const ProcessChoice& kept = process_choice(choice_key(plan), [&] {
    // Each candidate overwrites the outputs from inputs it does not change.
    Sizing trial = plan.sizing;  // its descriptor, with each algorithm in turn
    trial.candidates.clear();
    const auto launch_with = [this, &plan, &trial, stream, a, b, d](const cublasLtMatmulAlgo_t& algo) {
      trial.algo = algo;
      return launch(plan, trial, stream, a, b, d);
    };
    const SustainedPick pick = pick_sustained({problem, &candidates, stream, launch_with, {}, {}});
    if (file_ != nullptr) file_->store(shape, lt_algorithm_config(candidates[pick.kept]));
    return ProcessChoice{false, pick.description, candidates[pick.kept]};
  });
  plan.sizing.algo = kept.algo;
  plan.choice = kept.description;
}

LtProblem EpilogueGemm::problem_of(const Plan& plan, const Sizing& sizing) const {
  return LtProblem{handle_, sizing.desc, plan.a_layout, plan.b_layout, plan.d_layout,
                   plan.type, plan.type, kWorkspaceBytes};
}

std::string EpilogueGemm::shape_of(const Plan& plan) {
  const char* epilogue = plan.epilogue == Epilogue::bias            ? "bias"
                         : plan.epilogue == Epilogue::gelu_bias     ? "gelu_bias"
                         : plan.epilogue == Epilogue::gelu_aux_bias ? "gelu_aux_bias"
                                                                    : "dgelu";
  std::ostringstream shape;
  shape << epilogue << (plan.type == CUDA_R_16BF ? " bf16" : " fp16") << " m=" << plan.m << " n=" << plan.n
        << " k=" << plan.k;
  if (plan.multiprocessor_target > 0) shape << " on " << plan.multiprocessor_target << " multiprocessors";
  return shape.str();
}

std::vector<std::string> EpilogueGemm::algorithm_report() const {
  std::vector<std::string> lines;
  for (const Plan& plan : plans_)
    if (plan.sizing.usable && plan.chosen) lines.push_back(shape_of(plan) + ": " + plan.choice);
  return lines;
}

void EpilogueGemm::set_pointer(Plan& plan, cublasLtMatmulDescAttributes_t attribute,
                               const void* pointer) {
  for (Sizing* sizing : {&plan.sizing, &plan.fewer})
    if (sizing->desc) set_attribute(sizing->desc, attribute, pointer);
}

bool EpilogueGemm::run_epilogue(cudaStream_t stream, const EpilogueCall& call) {
  Plan* plan = aligned_plan_for(call.epilogue, call.type, call.m, call.n, call.k,
                                {call.a, call.b, call.d, call.bias, call.aux});
  if (plan == nullptr) return false;
  if (call.bias != nullptr) set_pointer(*plan, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias);
  if (call.aux != nullptr) set_pointer(*plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
  run(*plan, stream, call.a, call.b, call.d);
  return true;
}

bool EpilogueGemm::forward(cudaStream_t stream, cudaDataType_t type,
                           const MatmulForwardArgs<void>& args) {
  return run_epilogue(stream, {Epilogue::bias, type, args.out_channels, args.rows, args.in_channels,
                               args.weight, args.inp, args.out, args.bias, nullptr});
}

bool EpilogueGemm::gelu_forward(cudaStream_t stream, cudaDataType_t type,
                                const DenseGeluForwardArgs<void>& args) {
  const Epilogue epilogue = args.pre != nullptr ? Epilogue::gelu_aux_bias : Epilogue::gelu_bias;
  return run_epilogue(stream, {epilogue, type, args.out_channels, args.rows, args.in_channels,
                               args.weight, args.inp, args.out, args.bias, args.pre});
}

bool EpilogueGemm::gelu_input_gradient(cudaStream_t stream, cudaDataType_t type,
                                       const DenseGeluBackwardArgs<void>& args) {
  return run_epilogue(stream, {Epilogue::dgelu, type, args.in_channels, args.rows,
                               args.out_channels, args.weight, args.dout, args.dpre, nullptr,
                               args.pre});
}

}  // namespace scalestudy::cuda
