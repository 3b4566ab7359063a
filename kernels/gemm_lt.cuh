#pragma once
// The dense layers' GEMMs in cuBLASLt, with work folded into the epilogue so that it costs
// no pass of its own over the output:
// - the bias (CUBLASLT_EPILOGUE_BIAS), in every 16-bit dense layer's forward;
// - the bias and GPT-2's GELU (CUBLASLT_EPILOGUE_GELU_AUX_BIAS), in the MLP's first dense
//   layer, which also stores the GELU's input as the epilogue's auxiliary output; without
//   that output (CUBLASLT_EPILOGUE_GELU_BIAS) where no backward needs it (inference);
// - the GELU's derivative (CUBLASLT_EPILOGUE_DGELU), in the input gradient of the MLP's
//   second dense layer, which reads that auxiliary matrix back.
// cuBLASLt takes the bias in the output's type (an fp32 bias vector with a bf16 output was
// refused on an H200 with CUBLAS_STATUS_INVALID_VALUE), so the bias comes from the 16-bit
// copy of the parameters, like the weight; each output is rounded once, from the fp32
// accumulator after the epilogue's arithmetic. The auxiliary matrix has the output's type
// (cuBLASLt's default), which is the 16-bit storage of the activation it stands for.
//
// The fused GELU must be the tanh approximation that GPT-2 and kernels/gelu.cu use.
// cuBLASLt's documentation names no formula for it, so the GPU test
// GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu checks the forward and the derivative
// against the tanh form on inputs where the erf form fails the same check.
//
// Every epilogue call returns false, having done nothing, where cuBLASLt offers no
// algorithm, the operands are not 16-byte aligned, or an operand has 2^31 elements or more
// (the limit that matmul.cu's row chunks keep): the caller then runs the unfused kernels.
// Plans (descriptors, layouts and the algorithm) are made once per epilogue and shape and
// kept.
//
// The algorithm: cuBLASLt's first, unless
// - a GemmChooser (a choice file, gemm_choice_file.cuh) names one for the shape: then it
//   runs, for the GEMMs with an epilogue and for the plain 16-bit GEMMs (gemm(Blas, ...),
//   which otherwise take cuBLAS's own algorithm);
// - timed is on, and the shape is a GEMM with an epilogue sized for the whole device.
//   cuBLASLt's heuristic picks without running, and the SM count target (the
//   multiprocessors a GEMM is sized for) changes what it offers: for GPT-2 medium's DGELU
//   GEMM it offers a single algorithm sized for the whole device, an sm80 kernel, and for a
//   few multiprocessors fewer an sm90 kernel that takes well under its time. So each such
//   plan also asks for an algorithm sized for kTimedGemmFewerMultiprocessors fewer, and its
//   first call times both on that call's own operands (each overwrites its outputs from
//   inputs it does not change). The fewer-multiprocessor one is kept only where it is
//   kTimedGemmRequiredGainPercent faster: back-to-back timing misleads by more than the few
//   per cent that separate most candidates (at the power cap a kernel faster alone can
//   lengthen the step). The call's results are the kept algorithm's. The choice is made
//   once per process for each device, epilogue and shape, so every LtGemm in a process
//   computes the same bits; another process may choose otherwise where a gain lies within
//   timing noise of the threshold. Without timed and a chooser, the algorithm, and so the
//   bits, are the same on every run.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "gemm.cuh"
#include "gemm_choice_file.cuh"
#include "op_params.h"
#include "matmul.cuh"

namespace scalestudy::cuda {

// How much faster a timed GEMM sized for fewer multiprocessors must run than cuBLASLt's
// first for the whole device, to be kept (per cent): above the margin by which back-to-back
// timing favours algorithms that do not shorten the step, below the gain of the sm90
// kernel over the sm80 one that GPT-2 medium's DGELU GEMM is offered.
inline constexpr int kTimedGemmRequiredGainPercent = 25;
// A timed GEMM's other sizing: this many multiprocessors fewer than the device has, the
// sizing that the overlapped lane's default CTAs leave (--overlapped-ctas auto, 4).
inline constexpr int kTimedGemmFewerMultiprocessors = 4;

// Milliseconds between two events around `calls` launches on `stream`, each checked.
double timed_ms(cudaStream_t stream, const GemmLaunch& launch, int calls);

class LtGemm {
 public:
  // The cuBLASLt workspace this object allocates.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // timed: also time cuBLASLt's first for fewer multiprocessors (above). chooser (may be
  // null): the algorithms it names win, and the plain GEMMs it is asked about run here.
  explicit LtGemm(bool timed = false, std::shared_ptr<GemmChooser> chooser = nullptr);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // The dense layer out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] through an
  // epilogue, every operand of `type` (CUDA_R_16BF or CUDA_R_16F) and row-major, from the
  // layer's arguments with untyped pointers. forward: out = inp @ weight^T + bias.
  bool forward(cudaStream_t stream, cudaDataType_t type, const MatmulForwardArgs<void>& args);
  // pre = inp @ weight^T + bias and out = gelu(pre), both written; out is the GELU of the
  // fp32 sum, before pre is rounded. pre is the epilogue's auxiliary output; a null pre
  // is not written (inference).
  bool gelu_forward(cudaStream_t stream, cudaDataType_t type,
                    const DenseGeluForwardArgs<void>& args);
  // The input gradient of a dense layer out = gelu(pre) @ weight^T + bias, carried on
  // through the GELU: dpre = gelu'(pre) * (dout @ weight), written (dpre's old contents are
  // never read). Reads dpre, dout, pre, weight and the shape of args.
  bool gelu_input_gradient(cudaStream_t stream, cudaDataType_t type,
                           const DenseGeluBackwardArgs<void>& args);
  // A plain GEMM (no epilogue, one matrix, alpha = 1, 16-bit operands, aligned) through the
  // algorithm the chooser names for its shape; false, having done nothing, where there is
  // no chooser, it names none or "cublas", or g is not such a GEMM.
  bool plain(cublasHandle_t handle, const GemmArgs& g);
  // Whether plain() can take any GEMM: there is a chooser.
  bool chooses_plain() const { return chooser_ != nullptr; }
  // The multiprocessors the GEMMs from now on are sized for (cuBLASLt's SM count target),
  // where other kernels hold the rest; 0 for the whole device. Each target has its plans.
  void set_multiprocessor_target(int multiprocessors) { multiprocessor_target_ = multiprocessors; }

  // One line per plan that has run: its shape and how its algorithm was chosen.
  std::vector<std::string> algorithm_report() const;

 private:
  enum class Epilogue { none, bias, gelu_bias, gelu_aux_bias, dgelu };
  // One GEMM D[m,n] = op_a(A) · op_b(B) (+ D where adds) in cuBLAS's column-major terms.
  struct Shape {
    Epilogue epilogue;
    cudaDataType_t ab_type, c_type;
    cublasOperation_t op_a, op_b;
    int m, n, k, lda, ldb, ldc;
    bool adds;
    int multiprocessor_target;  // set_multiprocessor_target's, when the plan was made
    bool operator==(const Shape& other) const;
  };
  // One algorithm for a plan, sized for `multiprocessors` (cuBLASLt's SM count target; 0:
  // the whole device).
  struct Sizing {
    int multiprocessors = 0;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;  // it has an algorithm
  };
  struct Plan {
    Shape shape;
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
    Sizing sizing;        // what runs (plain: unless runs_cublas)
    Sizing fewer;         // timed, until the first call has chosen: the other sizing
    bool runs_cublas = false;  // plain: cuBLAS's own runs
    bool chosen = false;  // sizing is final
    std::string choice;   // how it was chosen, for algorithm_report
  };
  // The plan of a shape, made at its first call; nullptr where cuBLASLt has no algorithm.
  Plan* plan_for(const Shape& shape);
  Sizing size_for(const Plan& plan, int multiprocessors) const;
  // One GEMM of an epilogue: D = op(A) B (+ C) in cuBLAS's column-major terms, with the bias
  // and the auxiliary matrix that the epilogue takes (null where it takes none).
  struct EpilogueCall {
    Epilogue epilogue;
    cudaDataType_t type;
    int m, n, k;
    int ldb;  // B's rows: k, or an augmented input's row stride
    int ldd;  // D's rows: m, or an augmented output's row stride (the auxiliary's are m)
    const void* a;
    const void* b;
    void* d;
    const void* bias;
    const void* aux;
    const void* c = nullptr;  // added to the result, in D's layout (beta = 1); null: none
  };
  // Runs the call's plan with its pointers set, or returns false, having done nothing,
  // where an operand is not 16-byte aligned or the shape is not one the plans take.
  bool run_epilogue(cudaStream_t stream, const EpilogueCall& call);
  // A bias or auxiliary pointer, on every descriptor the plan holds.
  static void set_pointer(Plan& plan, cublasLtMatmulDescAttributes_t attribute, const void* pointer);
  // Operands of one call. A plan that adds reads C from c, or from d where c is null.
  struct Operands {
    const void* a;
    const void* b;
    void* d;
    const void* c = nullptr;
  };
  // Sets the plan's algorithm for good: the chooser's, or (timed) the faster sizing on
  // these operands where it clears the threshold. `fallback` runs what runs without a choice.
  void choose(Plan& plan, cudaStream_t stream, const Operands& on, const GemmLaunch& fallback);
  // Takes the chooser's algorithm for the plan; false where it names none this cuBLASLt takes.
  bool take_chosen(Plan& plan, cudaStream_t stream, const Operands& on, const GemmLaunch& fallback);
  // Swaps plan.fewer into plan.sizing where the process's choice for this shape, made now
  // if it has none, kept it.
  void keep_faster_sizing(Plan& plan, cudaStream_t stream, const Operands& on);
  // Milliseconds per call of one sizing on these operands (median of a few trials), or a
  // negative value where cuBLASLt refuses to run it.
  double time_sizing(const Plan& plan, const Sizing& sizing, cudaStream_t stream, const Operands& on);
  cublasStatus_t launch(const Plan& plan, const Sizing& sizing, cudaStream_t stream, const Operands& on);
  // The plan's GEMM through one sizing's descriptor, as gemm_choice_file.cuh takes it.
  LtProblem problem_of(const Plan& plan, const Sizing& sizing) const;
  // "<epilogue> <type> m=... n=... k=...[ on <target> multiprocessors]"; a plain GEMM's
  // also names its leading dimensions, operations, fp32 output and whether it adds.
  static std::string shape_text(const Shape& shape);

  bool timed_;
  std::shared_ptr<GemmChooser> chooser_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::vector<Plan> plans_;
  int multiprocessor_target_ = 0;
  int device_multiprocessors_ = 0;
};

// The cuBLAS handle that one stream's GEMMs go through and, where a chooser names
// algorithms for plain GEMMs, the LtGemm that runs them (null otherwise).
struct Blas {
  cublasHandle_t handle = nullptr;
  LtGemm* lt = nullptr;
};

inline void gemm(const Blas& blas, const GemmArgs& g) {
  if (blas.lt != nullptr && blas.lt->plain(blas.handle, g)) return;
  gemm(blas.handle, g);
}

}  // namespace scalestudy::cuda
