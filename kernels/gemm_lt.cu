#include "gemm_lt.cuh"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "common.cuh"
#include "cuda_check.h"

namespace scalestudy::cuda {
namespace {

// 16-bit columns of a multiple of 8 elements keep every column 16-byte aligned.
constexpr int kAlignedColumns = 8;
constexpr long long kMaxOperandElems = (1LL << 31) - 1;

template <class Value>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// Leading dimensions a multiple of 8 and no operand of 2^31 elements or more.
bool shape_allowed(int m, int n, int k) {
  const auto elems = [](int rows, int columns) { return static_cast<long long>(rows) * columns; };
  return m % kAlignedColumns == 0 && k % kAlignedColumns == 0 && elems(m, n) <= kMaxOperandElems &&
         elems(k, n) <= kMaxOperandElems && elems(m, k) <= kMaxOperandElems;
}

size_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

bool is_16bit(cudaDataType_t type) { return type == CUDA_R_16BF || type == CUDA_R_16F; }

// A plain GEMM that cuBLASLt runs here: one matrix, alpha = 1, 16-bit operands, a result in
// their type or fp32, every operand and column 16-byte aligned.
bool lt_takes(const GemmArgs& g) {
  const auto aligned_ld = [](int ld, cudaDataType_t type) {
    return ld * element_bytes(type) % kLtOperandAlignmentBytes == 0;
  };
  return g.batch_count == 1 && g.alpha == 1.0f && is_16bit(g.types.ab) &&
         (g.types.c == g.types.ab || g.types.c == CUDA_R_32F) && aligned_ld(g.a.ld, g.types.ab) &&
         aligned_ld(g.b.ld, g.types.ab) && aligned_ld(g.c.ld, g.types.c) && lt_aligned(g.a.data) &&
         lt_aligned(g.b.data) && lt_aligned(g.c.data);
}

// The timed choices, one per device, epilogue, type, shape and multiprocessor target,
// shared by every LtGemm of the process: whether the sizing for fewer multiprocessors was
// kept, and the report.
using ChoiceKey = std::tuple<int, int, int, int, int, int, int>;
struct ProcessChoice {
  bool fewer_kept = false;
  std::string description;
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

bool LtGemm::Shape::operator==(const Shape& other) const {
  return std::tie(epilogue, ab_type, c_type, op_a, op_b, m, n, k, lda, ldb, ldc, adds, multiprocessor_target) ==
         std::tie(other.epilogue, other.ab_type, other.c_type, other.op_a, other.op_b, other.m, other.n, other.k,
                  other.lda, other.ldb, other.ldc, other.adds, other.multiprocessor_target);
}

LtGemm::LtGemm(bool timed, std::shared_ptr<GemmChooser> chooser) : timed_(timed), chooser_(std::move(chooser)) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&device_multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUBLAS(cublasLtCreate(&handle_));
  CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
}

LtGemm::~LtGemm() {
  for (Plan& plan : plans_) {
    for (cublasLtMatrixLayout_t layout : {plan.a_layout, plan.b_layout, plan.d_layout})
      CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(layout));
    for (Sizing* sizing : {&plan.sizing, &plan.fewer})
      if (sizing->desc) CHECK_CUBLAS(cublasLtMatmulDescDestroy(sizing->desc));
  }
  CHECK_CUDA(cudaFree(workspace_));
  CHECK_CUBLAS(cublasLtDestroy(handle_));
}

// Column-major, as gemm.cuh explains: A is m x k (op N) or k x m (op T), B is k x n or
// n x k, D is m x n. The auxiliary matrix of an epilogue has D's shape and leading
// dimension m (D's is ldc: m, or an augmented output's row stride).
LtGemm::Plan* LtGemm::plan_for(const Shape& shape) {
  for (Plan& plan : plans_)
    if (plan.shape == shape) return plan.sizing.usable ? &plan : nullptr;
  Plan plan{shape};
  const bool a_plain = shape.op_a == CUBLAS_OP_N, b_plain = shape.op_b == CUBLAS_OP_N;
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a_layout, shape.ab_type, a_plain ? shape.m : shape.k,
                                          a_plain ? shape.k : shape.m, shape.lda));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.b_layout, shape.ab_type, b_plain ? shape.k : shape.n,
                                          b_plain ? shape.n : shape.k, shape.ldb));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.d_layout, shape.c_type, shape.m, shape.n, shape.ldc));
  plan.sizing = size_for(plan, shape.multiprocessor_target);
  plan.runs_cublas = shape.epilogue == Epilogue::none;
  const bool whole_device = shape.multiprocessor_target == 0;
  if (plan.sizing.usable && timed_ && whole_device && shape.epilogue != Epilogue::none)
    plan.fewer = size_for(plan, device_multiprocessors_ - kTimedGemmFewerMultiprocessors);
  plans_.push_back(plan);
  return plans_.back().sizing.usable ? &plans_.back() : nullptr;
}

// Split-K may reduce in fp32 only (the compute type), never in the 16-bit output type.
LtGemm::Sizing LtGemm::size_for(const Plan& plan, int multiprocessors) const {
  const Shape& shape = plan.shape;
  Sizing sizing{multiprocessors};
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&sizing.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_TRANSA, shape.op_a);
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_TRANSB, shape.op_b);
  if (multiprocessors > 0) set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{multiprocessors});
  if (shape.epilogue == Epilogue::none) {
    sizing.usable = true;  // cuBLAS's own runs until a choice is taken
    return sizing;
  }
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
  if (shape.epilogue == Epilogue::gelu_bias) kind = CUBLASLT_EPILOGUE_GELU_BIAS;
  if (shape.epilogue == Epilogue::gelu_aux_bias) kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (shape.epilogue == Epilogue::dgelu) kind = CUBLASLT_EPILOGUE_DGELU;
  set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, kind);
  if (shape.epilogue == Epilogue::gelu_aux_bias || shape.epilogue == Epilogue::dgelu)
    set_attribute(sizing.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{shape.m});
  // A refusal (no algorithm, or a configuration this cuBLASLt does not take) is an answer,
  // not a failure: the caller falls back to the unfused kernels, and the GPU tests
  // BiasEpilogueTakesTheGpt2Shapes and GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu say
  // so where it happens.
  const std::vector<cublasLtMatmulAlgo_t> first = lt_candidates(problem_of(plan, sizing), 1);
  sizing.usable = !first.empty();
  if (sizing.usable) sizing.algo = first.front();
  return sizing;
}

// beta = 0 (D only written, passed as C too, which cuBLASLt then never reads), or for a
// GEMM that adds, beta = 1 on C: D itself for a plain GEMM, the call's c for an epilogue's.
cublasStatus_t LtGemm::launch(const Plan& plan, const Sizing& sizing, cudaStream_t stream, const Operands& on) {
  const float alpha = 1.0f, beta = plan.shape.adds ? 1.0f : 0.0f;
  const void* c = on.c != nullptr ? on.c : on.d;
  return cublasLtMatmul(handle_, sizing.desc, &alpha, on.a, plan.a_layout, on.b, plan.b_layout, &beta, c,
                        plan.d_layout, on.d, plan.d_layout, &sizing.algo, workspace_, kWorkspaceBytes, stream);
}

bool LtGemm::plain(cublasHandle_t handle, const GemmArgs& g) {
  if (chooser_ == nullptr || !lt_takes(g)) return false;
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(handle, &stream));
  Plan* plan = plan_for({Epilogue::none, g.types.ab, g.types.c, g.op_a, g.op_b, g.m, g.n, g.k, g.a.ld, g.b.ld,
                         g.c.ld, g.beta != 0.0f, multiprocessor_target_});
  const Operands on{g.a.data, g.b.data, g.c.data};
  if (!plan->chosen) choose(*plan, stream, on, [&] { return cublas_gemm(handle, g); });
  if (plan->runs_cublas) return false;
  CHECK_CUBLAS(launch(*plan, plan->sizing, stream, on));
  return true;
}

double LtGemm::time_sizing(const Plan& plan, const Sizing& sizing, cudaStream_t stream, const Operands& on) {
  // An algorithm the heuristic offered may still be refused at launch: it then does not run.
  if (launch(plan, sizing, stream, on) != CUBLAS_STATUS_SUCCESS) return -1.0;
  const GemmLaunch call = [&] { return launch(plan, sizing, stream, on); };
  std::vector<double> trials;
  for (int trial = 0; trial < kTimedTrials; ++trial)
    trials.push_back(timed_ms(stream, call, kCallsPerTrial) / kCallsPerTrial);
  std::sort(trials.begin(), trials.end());
  return trials[trials.size() / 2];
}

void LtGemm::choose(Plan& plan, cudaStream_t stream, const Operands& on, const GemmLaunch& fallback) {
  plan.chosen = true;
  plan.choice = plan.runs_cublas ? "cuBLAS's own" : "cuBLASLt's first";
  if (!take_chosen(plan, stream, on, fallback) && plan.fewer.usable) keep_faster_sizing(plan, stream, on);
  if (plan.fewer.desc) CHECK_CUBLAS(cublasLtMatmulDescDestroy(plan.fewer.desc));
  plan.fewer = Sizing{};
}

bool LtGemm::take_chosen(Plan& plan, cudaStream_t stream, const Operands& on, const GemmLaunch& fallback) {
  if (chooser_ == nullptr) return false;
  const LtProblem problem = problem_of(plan, plan.sizing);
  Sizing trial = plan.sizing;  // its descriptor, with each algorithm in turn
  const LtLaunch launch_with = [&](const cublasLtMatmulAlgo_t& algo) {
    trial.algo = algo;
    return launch(plan, trial, stream, on);
  };
  const bool plain_gemm = plan.shape.epilogue == Epilogue::none;
  const std::optional<std::string> chosen =
      chooser_->choose({shape_text(plan.shape), problem, stream, launch_with, fallback, plain_gemm});
  if (!chosen) return false;
  if (plain_gemm && *chosen == "cublas") {
    plan.choice = "cuBLAS's own, as chosen for this shape";
    return true;
  }
  const std::optional<cublasLtMatmulAlgo_t> algo = lt_algorithm_of(problem, *chosen);
  if (!algo) {
    plan.choice += " (this cuBLASLt refuses the chosen " + *chosen + ")";
    return false;
  }
  plan.sizing.algo = *algo;
  plan.runs_cublas = false;
  plan.choice = *chosen + ", as chosen for this shape";
  return true;
}

void LtGemm::keep_faster_sizing(Plan& plan, cudaStream_t stream, const Operands& on) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  const Shape& shape = plan.shape;
  const ChoiceKey key{device, static_cast<int>(shape.epilogue), static_cast<int>(shape.ab_type), shape.m,
                      shape.n, shape.k, shape.multiprocessor_target};
  const ProcessChoice& kept = process_choice(key, [&] {
    const double whole_ms = time_sizing(plan, plan.sizing, stream, on);
    const double fewer_ms = time_sizing(plan, plan.fewer, stream, on);
    SCALESTUDY_CHECK(whole_ms >= 0.0 || fewer_ms >= 0.0,
                     "cuBLASLt refused to run the algorithms its heuristic offered");
    const double required_gain = kTimedGemmRequiredGainPercent / 100.0;
    const bool fewer_kept = fewer_ms >= 0.0 && (whole_ms < 0.0 || fewer_ms <= (1.0 - required_gain) * whole_ms);
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

LtProblem LtGemm::problem_of(const Plan& plan, const Sizing& sizing) const {
  return LtProblem{handle_, sizing.desc, plan.a_layout, plan.b_layout, plan.d_layout,
                   plan.shape.ab_type, plan.shape.c_type, kWorkspaceBytes};
}

std::string LtGemm::shape_text(const Shape& shape) {
  constexpr const char* kEpilogueNames[] = {"plain", "bias", "gelu_bias", "gelu_aux_bias", "dgelu"};
  std::ostringstream text;
  text << kEpilogueNames[static_cast<int>(shape.epilogue)] << (shape.ab_type == CUDA_R_16BF ? " bf16" : " fp16")
       << " m=" << shape.m << " n=" << shape.n << " k=" << shape.k;
  if (shape.epilogue == Epilogue::none)
    text << " lda=" << shape.lda << " ldb=" << shape.ldb << " ldc=" << shape.ldc << " op "
         << (shape.op_a == CUBLAS_OP_N ? 'N' : 'T') << (shape.op_b == CUBLAS_OP_N ? 'N' : 'T')
         << (shape.c_type == CUDA_R_32F ? ", fp32 out" : "") << (shape.adds ? ", adds" : "");
  if (shape.multiprocessor_target > 0) text << " on " << shape.multiprocessor_target << " multiprocessors";
  return text.str();
}

std::vector<std::string> LtGemm::algorithm_report() const {
  std::vector<std::string> lines;
  for (const Plan& plan : plans_)
    if (plan.sizing.usable && plan.chosen) lines.push_back(shape_text(plan.shape) + ": " + plan.choice);
  return lines;
}

void LtGemm::set_pointer(Plan& plan, cublasLtMatmulDescAttributes_t attribute, const void* pointer) {
  for (Sizing* sizing : {&plan.sizing, &plan.fewer})
    if (sizing->desc) set_attribute(sizing->desc, attribute, pointer);
}

// The forwards compute out^T[OC, N] = W[OC, IC] · inp^T[IC, N]: A is the row-major [OC, IC]
// weight seen as [IC, OC] (op T), and the bias runs along OC, the rows of out^T, which is
// what the epilogue broadcasts. The input gradient computes dpre^T[IC, N] = W^T[IC, OC] ·
// dout^T[OC, N]: A is the weight as is (op N).
bool LtGemm::run_epilogue(cudaStream_t stream, const EpilogueCall& call) {
  for (const void* operand : std::initializer_list<const void*>{call.a, call.b, call.d, call.bias, call.aux, call.c})
    if (!lt_aligned(operand)) return false;
  // B's rows span ldb elements and D's ldd: held to the same alignment and size as k.
  if (!shape_allowed(call.m, call.n, call.k) || !shape_allowed(call.m, call.n, call.ldb) ||
      !shape_allowed(call.m, call.n, call.ldd))
    return false;
  const bool transposed_a = call.epilogue != Epilogue::dgelu;
  Plan* plan = plan_for({call.epilogue, call.type, call.type, transposed_a ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                         call.m, call.n, call.k, transposed_a ? call.k : call.m, call.ldb, call.ldd,
                         call.c != nullptr, multiprocessor_target_});
  if (plan == nullptr) return false;
  if (call.bias != nullptr) set_pointer(*plan, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias);
  if (call.aux != nullptr) set_pointer(*plan, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
  const Operands on{call.a, call.b, call.d, call.c};
  if (!plan->chosen) choose(*plan, stream, on, [&] { return launch(*plan, plan->sizing, stream, on); });
  CHECK_CUBLAS(launch(*plan, plan->sizing, stream, on));
  return true;
}

bool LtGemm::forward(cudaStream_t stream, cudaDataType_t type, const MatmulForwardArgs<void>& args) {
  return run_epilogue(stream, {Epilogue::bias, type, args.out_channels, args.rows, args.in_channels,
                               row_stride(args.inp_stride, args.in_channels), args.out_channels,
                               args.weight, args.inp, args.out, args.bias, nullptr, args.residual});
}

bool LtGemm::gelu_forward(cudaStream_t stream, cudaDataType_t type, const DenseGeluForwardArgs<void>& args) {
  const Epilogue epilogue = args.pre != nullptr ? Epilogue::gelu_aux_bias : Epilogue::gelu_bias;
  return run_epilogue(stream, {epilogue, type, args.out_channels, args.rows, args.in_channels,
                               row_stride(args.inp_stride, args.in_channels),
                               row_stride(args.out_stride, args.out_channels), args.weight, args.inp,
                               args.out, args.bias, args.pre});
}

bool LtGemm::gelu_input_gradient(cudaStream_t stream, cudaDataType_t type, const DenseGeluBackwardArgs<void>& args) {
  return run_epilogue(stream, {Epilogue::dgelu, type, args.in_channels, args.rows, args.out_channels,
                               args.out_channels, args.in_channels, args.weight, args.dout, args.dpre,
                               nullptr, args.pre});
}

}  // namespace scalestudy::cuda
