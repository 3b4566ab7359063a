// Timings of the CUDA backend's ops, for the developer tuning them: GPT-2 small's ops one
// by one and its MLP through the plain ops and the dense-GELU pair (bf16 and fp16), every
// algorithm cuBLASLt offers for GPT-2's epilogue GEMMs (bf16), the fused attention against
// the cuBLAS path (bf16), and the step's GEMMs through each of cuBLASLt's first candidates
// (gemm_energy.cpp); with OP_TIMINGS_ENERGY set, the energy of a call too
// (energy_per_call.h). They print and assert nothing, so they are no tests: built with
// -DSCALESTUDY_DEV=ON, run as build/<preset>/dev/op_timings on a GPU (--gtest_filter picks
// some).
#include <cublasLt.h>

#include "attention.cuh"
#include "cuda_ops_fixture.h"
#include "energy_per_call.h"
#include "flash_attention_support.h"
#include "lt_candidates.h"
#include "trial_times.h"

namespace scalestudy::gpu_test {
namespace {

// Median milliseconds per call of `work` (trial_times.h) on the compute stream, with the
// trials' spread printed.
double median_ms(CudaOps& ops, int reps, const std::function<void()>& work) {
  const TrialTimes times = time_trials(ops.stream(), reps, work);
  std::cout << "    (spread " << times.fastest_ms << " .. " << times.slowest_ms << " ms)";
  return times.median_ms;
}

// Prints "  <label> (spread ...): <median> ms", the median of median_ms.
void print_median_ms(CudaOps& ops, const std::string& label, int reps, const std::function<void()>& work) {
  std::cout << "  " << label;
  const double ms = median_ms(ops, reps, work);
  std::cout << ": " << ms << " ms" << energy_suffix(ops.stream(), ms, work) << "\n";
}

// GPT-2 small (124M) at batch 8, seq 1024: the forward + backward of one micro-batch in
// the 16-bit precision (and, in the bf16 instance, fp32), and the 16-bit ops one by one.
TEST_P(CudaOpsHalf, Gpt2SmallTimings) {
  const ModelShape shape{12, 768, 12, 50257, 1024, true};
  const int B = 8, T = 1024, N = B * T, C = 768, V = 50257;
  const auto inputs = random_ids(size_t(N), 100, V), targets = random_ids(size_t(N), 101, V);
  const float loss_scale = tol_.model_loss_scale / static_cast<float>(N);
  std::vector<Precision> precisions{precision_};
  if (precision_ == Precision::bf16) precisions.push_back(Precision::fp32);
  for (Precision precision : precisions) {
    CudaOps ops(0, precision);
    const ParameterLayout layout = make_parameter_layout(shape);
    Gpt model(ops, shape, B, T, layout.param_elems);
    model.initialize(1);
    ops.parameters_changed(model.params(), 0, layout.param_elems);
    float* grads = ops.allocate_floats(layout.param_elems, MemoryKind::gradients);
    ops.fill_zero(grads, layout.param_elems);
    FullGradient sink(grads);
    const std::string mode = precision_name(precision);
    std::cout << "  " << mode << " forward";
    const double forward_ms =
        median_ms(ops, 1, [&] { model.forward(inputs.data(), targets.data(), nullptr); });
    std::cout << "\n  " << mode << " forward+backward";
    const auto forward_backward = [&] {
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
    };
    const double step_ms = median_ms(ops, 1, forward_backward);
    std::cout << energy_suffix(ops.stream(), step_ms, forward_backward);
    // A whole ddp step on one GPU: zeroed gradients, the gradient norm, AdamW, and the
    // refresh of the parameters' 16-bit copy.
    float* m = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    float* v = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    ops.fill_zero(m, layout.param_elems);
    ops.fill_zero(v, layout.param_elems);
    AdamWParams hyper;
    hyper.learning_rate = 1e-4f;
    std::cout << "\n  " << mode << " full step";
    const auto full_step = [&] {
      ops.fill_zero(grads, layout.param_elems);
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
      (void)ops.sum_of_squares(grads, layout.param_elems);
      ops.adamw_update(model.params(), grads, m, v, layout.param_elems, hyper);
      ops.parameters_changed(model.params(), 0, layout.param_elems);
    };
    const double full_ms = median_ms(ops, 1, full_step);
    std::cout << energy_suffix(ops.stream(), full_ms, full_step);
    std::cout << "\n  " << mode << ": forward " << forward_ms << " ms, forward+backward " << step_ms
              << " ms = " << N / (step_ms * 1e-3) << " tokens/s; full step " << full_ms
              << " ms = " << N / (full_ms * 1e-3) << " tokens/s (loss " << model.mean_loss()
              << ")\n";
    ops.release(m);
    ops.release(v);
    ops.release(grads);
  }

  // The 16-bit ops at GPT-2 small shapes.
  CudaOps& ops = *gpu_;
  auto fp32 = [&](size_t elems, MemoryKind kind) {
    float* p = ops.allocate_floats(elems, kind);
    owned_.push_back(p);
    ops.fill_zero(p, elems);
    return p;
  };
  auto act = [&](size_t elems) { return fp32(elems, MemoryKind::activations); };
  const size_t NC = size_t(N) * C, param_elems = size_t(V) * C + 4 * C;
  float* params = fp32(param_elems, MemoryKind::parameters);
  ops.parameters_changed(params, 0, param_elems);
  float* grads = fp32(param_elems, MemoryKind::gradients);
  float *x = act(NC), *y = act(NC), *wide = act(4 * NC), *wide2 = act(4 * NC);
  float *qkv = act(3 * NC), *dqkv = act(3 * NC), *probs = act(size_t(B) * 12 * T * T);
  float *logits = act(size_t(N) * V), *dlogits = act(size_t(N) * V), *scratch_weight = act(size_t(V) * C);
  float* padded_logits = ops.allocate_logits(N, V);
  owned_.push_back(padded_logits);
  float *stats = ops.allocate_statistics(2 * size_t(N)), *losses = ops.allocate_statistics(N);
  owned_.push_back(stats);
  owned_.push_back(losses);
  int32_t* d_targets = ops.allocate_ints(N, MemoryKind::activations);
  owned_.push_back(d_targets);
  ops.copy_ints_from_host(d_targets, targets.data(), N);
  const AttentionShape att{B, T, C, 12, true};
  // The backward ops write their input gradients as the model's step does.
  constexpr GradientWrite kFirst = GradientWrite::overwrite;
  // A dense layer's backward from [N, in_channels] to [N, out_channels], its input
  // gradient written over its input.
  auto dense_backward = [&](float* inp, const float* dout, float* dbias, int in_channels, int out_channels) {
    ops.matmul_backward({.dinp = inp, .dweight = grads, .dbias = dbias, .dout = dout, .inp = inp,
                         .weight = params, .rows = N, .in_channels = in_channels,
                         .out_channels = out_channels, .dinp_write = kFirst});
  };
  // The tied LM head on the padded logits, forward with and without dlogits, and its
  // backward whole, from dlogits, and for the weight in vocabulary ranges.
  const ClassifierForwardArgs<float> head_forward{.losses = losses, .row_stats = stats, .logits = padded_logits,
                                                  .inp = x, .weight = params, .targets = d_targets, .rows = N,
                                                  .channels = C, .vocab = V, .dlogits_scale = std::nullopt};
  ClassifierForwardArgs<float> head_forward_with_dlogits = head_forward;
  head_forward_with_dlogits.dlogits_scale = loss_scale;
  const ClassifierBackwardArgs<float> head_backward{.dinp = y, .logits = padded_logits, .row_stats = stats,
                                                    .weight = params, .targets = d_targets, .rows = N,
                                                    .channels = C, .vocab = V, .loss_scale = loss_scale,
                                                    .dinp_write = kFirst};
  auto head_weight_backward = [&](int vocab_begin, int vocab_end) {
    ops.classifier_weight_backward({.dweight = grads, .dlogits = padded_logits, .inp = x, .rows = N,
                                    .channels = C, .vocab = V, .vocab_begin = vocab_begin,
                                    .vocab_end = vocab_end});
  };
  struct Timed {
    const char* name;
    int reps;
    std::function<void()> work;
  };
  const std::vector<Timed> timed = {
      {"matmul fwd 768->2304", 10, [&] { ops.matmul_forward(qkv, x, params, params + 1, N, C, 3 * C); }},
      {"matmul bwd 768->2304", 10, [&] { dense_backward(x, qkv, grads + 1, C, 3 * C); }},
      {"matmul fwd 768->3072", 10, [&] { ops.matmul_forward(wide, x, params, params + 1, N, C, 4 * C); }},
      {"matmul bwd 768->3072", 10, [&] { dense_backward(x, wide, grads + 1, C, 4 * C); }},
      {"matmul fwd 3072->768", 10, [&] { ops.matmul_forward(x, wide, params, params + 1, N, 4 * C, C); }},
      {"matmul bwd 3072->768", 10, [&] { dense_backward(wide, x, grads + 1, 4 * C, C); }},
      {"matmul fwd 768->768", 10, [&] { ops.matmul_forward(y, x, params, params + 1, N, C, C); }},
      {"matmul fwd LM head", 3, [&] { ops.matmul_forward(logits, x, params, nullptr, N, C, V); }},
      {"matmul bwd LM head", 3, [&] { dense_backward(x, dlogits, nullptr, C, V); }},
      {"attention fwd", 5, [&] { ops.attention_forward(y, probs, qkv, att); }},
      {"attention bwd", 5, [&] { ops.attention_backward(dqkv, y, qkv, y, probs, att, kFirst); }},
      {"layernorm fwd", 10, [&] { ops.layernorm_forward({.out = y, .mean = stats, .rstd = stats + N,
                                                         .inp = x, .weight = params, .bias = params,
                                                         .rows = N, .channels = C}); }},
      {"layernorm bwd", 10, [&] { ops.layernorm_backward({.dinp = x, .dweight = grads,
                                                          .dbias = grads + C, .dout = y, .inp = x,
                                                          .weight = params, .mean = stats,
                                                          .rstd = stats + N, .rows = N,
                                                          .channels = C, .dinp_write = kFirst}); }},
      {"gelu fwd", 10, [&] { ops.gelu_forward(wide2, wide, 4 * NC); }},
      {"gelu bwd", 10, [&] { ops.gelu_backward(wide2, wide, wide, 4 * NC, kFirst); }},
      {"residual fwd", 10, [&] { ops.residual_forward(y, x, y, NC); }},
      {"fill_zero 4NC", 10, [&] { ops.fill_zero(wide, 4 * NC); }},
      {"cross-entropy fwd", 3, [&] { ops.softmax_cross_entropy_forward(losses, stats, logits, d_targets, N, V); }},
      {"cross-entropy bwd", 3, [&] { ops.softmax_cross_entropy_backward(dlogits, logits, stats, d_targets, N, V, loss_scale); }},
      {"classifier fwd (padded logits)", 3, [&] { ops.classifier_forward(head_forward); }},
      {"classifier bwd (padded logits)", 3, [&] { ops.classifier_backward(head_backward); }},
      {"classifier fwd with dlogits (padded logits)", 3, [&] { ops.classifier_forward(head_forward_with_dlogits); }},
      {"classifier bwd from dlogits (padded logits)", 3,
       [&] { ops.classifier_backward_from_dlogits(input_gradient_of(head_backward)); }},
      {"classifier weight bwd (padded logits)", 3, [&] { head_weight_backward(0, V); }},
      {"classifier weight bwd in 4 parts", 3, [&] {
         for (int part = 3; part >= 0; --part)
           head_weight_backward(V * part / 32 * 8, part == 3 ? V : V * (part + 1) / 32 * 8);
       }},
      {"parameters_changed 38.6M (wte + 4C)", 3, [&] { ops.parameters_changed(params, 0, param_elems); }},
  };
  for (const Timed& t : timed) print_median_ms(ops, name() + " " + t.name, t.reps, t.work);

  // The LM head's rows are V = 50257 16-bit values long, not a multiple of 16 bytes; the
  // same three GEMMs with rows padded to a multiple of 8 (16 bytes) and of 64 (128-byte
  // lines, as allocate_logits pads them) show what each alignment costs.
  // The buffers are untyped here: only the cuBLAS data type says bf16 or fp16.
  const int padded_vocab = (V + 7) / 8 * 8, line_vocab = (V + 63) / 64 * 64;
  float* padded = act(size_t(N) * line_vocab);
  const float one = 1.0f, zero = 0.0f;
  const cublasHandle_t handle = ops.cublas_handle();
  const cudaDataType_t half_type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const void* weight = scratch_weight;
  const void* lnf = x;
  void* dlnf = y;
  // One column-major GEMM of the LM head: C = op_a(A) op_b(B) + beta C, in fp32 compute.
  struct HeadGemm {
    cublasOperation_t op_a, op_b;
    int m, n, k;
    const void* a;
    int lda;
    const void* b;
    int ldb;
    const float* beta;
    void* c;
    cudaDataType_t c_type;
    int ldc;
  };
  auto head_gemm = [&](const HeadGemm& g) {
    CHECK_CUBLAS(cublasGemmEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &one, g.a, half_type, g.lda, g.b, half_type,
                              g.ldb, g.beta, g.c, g.c_type, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int ld : {V, padded_vocab, line_vocab}) {
    void* head_out = ld == V ? logits : padded;
    const std::string label = " (ld " + std::to_string(ld) + ")";
    const HeadGemm gemms[] = {
        {CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, weight, C, lnf, C, &zero, head_out, half_type, ld},
        {CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, weight, C, head_out, ld, &one, dlnf, half_type, C},
        {CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, lnf, C, head_out, ld, &one, grads, CUDA_R_32F, C},
    };
    const char* names[] = {"fwd", "dinp", "dweight"};
    for (int i = 0; i < 3; ++i)
      print_median_ms(ops, std::string("raw GEMM LM head ") + names[i] + label, 3, [&] { head_gemm(gemms[i]); });
  }
}

// GPT-2 small's MLP at batch 32, seq 1024, through the plain
// ops and through the dense-GELU pair (per layer; the model has 12).
TEST_P(CudaOpsHalf, DenseGeluTimings) {
  const int N = 32768, C = 768, H = 4 * C;
  const size_t NH = size_t(N) * H;
  const size_t fc_bias_at = size_t(H) * C, proj_weight_at = fc_bias_at + H;
  const size_t param_elems = proj_weight_at + size_t(C) * H + C;
  float* params = upload(rounded(random_floats(param_elems, 94, -0.05f, 0.05f)), MemoryKind::parameters);
  gpu_->parameters_changed(params, 0, param_elems);
  float* grads = upload(std::vector<float>(param_elems, 0.0f), MemoryKind::gradients);
  const float *fc_weight = params, *fc_bias = params + fc_bias_at;
  const float* proj_weight = params + proj_weight_at;
  float *proj_dweight = grads + proj_weight_at, *proj_dbias = grads + proj_weight_at + size_t(C) * H;
  const float* ln2 = activation(rounded(random_floats(size_t(N) * C, 95)));
  const float* dout = activation(rounded(random_floats(size_t(N) * C, 96)));
  float *fch = poisoned_activation(NH), *fch_gelu = poisoned_activation(NH);
  float *dfch = poisoned_activation(NH), *dfch_gelu = poisoned_activation(NH);
  constexpr GradientWrite kFirst = GradientWrite::overwrite;
  struct Timed {
    const char* name;
    std::function<void()> work;
  };
  const std::vector<Timed> timed{
      {"fc fwd + gelu fwd (plain)", [&] {
         gpu_->matmul_forward(fch, ln2, fc_weight, fc_bias, N, C, H);
         gpu_->gelu_forward(fch_gelu, fch, NH);
       }},
      {"dense_gelu_forward", [&] { gpu_->dense_gelu_forward({.pre = fch, .out = fch_gelu,
                                                             .inp = ln2, .weight = fc_weight,
                                                             .bias = fc_bias, .rows = N,
                                                             .in_channels = C, .out_channels = H}); }},
      {"fc_proj bwd + gelu bwd (plain)", [&] {
         gpu_->matmul_backward({.dinp = dfch_gelu, .dweight = proj_dweight, .dbias = proj_dbias,
                                .dout = dout, .inp = fch_gelu, .weight = proj_weight, .rows = N,
                                .in_channels = H, .out_channels = C, .dinp_write = kFirst});
         gpu_->gelu_backward(dfch, fch, dfch_gelu, NH, kFirst);
       }},
      {"dense_backward_through_gelu", [&] {
         gpu_->dense_backward_through_gelu({.dpre = dfch, .dweight = proj_dweight,
                                            .dbias = proj_dbias, .dout = dout, .act = fch_gelu,
                                            .pre = fch, .weight = proj_weight, .rows = N,
                                            .in_channels = H, .out_channels = C,
                                            .dact_scratch = dfch_gelu});
       }},
  };
  const size_t before = gpu_->gelu_epilogue_gemms();
  for (const Timed& t : timed) print_median_ms(*gpu_, name() + " " + t.name, 10, t.work);
  std::cout << "  " << name() << " GELU epilogue GEMMs in the fused runs: "
            << gpu_->gelu_epilogue_gemms() - before << "\n";
}

// Every algorithm cuBLASLt's heuristic offers for GPT-2
// small's and medium's dense GEMMs at 32768 rows, in bf16, with the epilogues the step
// uses and the ones it could use instead (the GELU without its stored pre-activation, the
// DGELU with the bias gradient, the MLP's weights in the other layout), sized for the
// whole device and for the multiprocessors the overlapped lane leaves, timed one by one,
// with each algorithm's configuration. With --gemm-algos heuristic the step takes the
// first.
TEST_P(CudaOpsHalf, LtGemmCandidateTimings) {
  if (precision_ != Precision::bf16) GTEST_SKIP() << "the candidates are timed in bf16";
  // GPT-2 small's and medium's widths, at 32768 rows.
  const int N = 32768, widest = 1024;
  const size_t largest_elems = size_t(N) * 4 * widest;
  Rng rng(120);
  std::vector<uint16_t> host(largest_elems);
  for (uint16_t& value : host) value = bf16_bits_from_float(rng.uniform(-1.0f, 1.0f));
  auto device_bf16 = [&](size_t elems) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, elems * sizeof(uint16_t)));
    CHECK_CUDA(cudaMemcpy(buffer, host.data(), elems * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return buffer;
  };
  void *a = device_bf16(size_t(4) * widest * widest), *b = device_bf16(largest_elems);
  void *d = device_bf16(largest_elems), *aux = device_bf16(largest_elems),
       *bias = device_bf16(size_t(8) * widest);  // room for an fp32 bias gradient
  int multiprocessors = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  void* workspace = nullptr;
  const size_t workspace_bytes = cuda::LtGemm::kWorkspaceBytes;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  cublasLtHandle_t handle = nullptr;
  CHECK_CUBLAS(cublasLtCreate(&handle));

  struct Shape {
    const char* name;
    cublasLtEpilogue_t epilogue;
    bool transposed_a;
    int m, n, k;
  };
  std::vector<Shape> shapes;
  for (const int C : {768, widest}) {
    const int H = 4 * C;
    shapes.insert(shapes.end(), {
        {"fc forward, GELU_AUX_BIAS", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, H, N, C},
        {"fc forward, GELU_AUX_BIAS, weight transposed", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, false, H, N, C},
        {"fc forward, GELU_BIAS (no aux)", CUBLASLT_EPILOGUE_GELU_BIAS, true, H, N, C},
        {"fc forward, BIAS only", CUBLASLT_EPILOGUE_BIAS, true, H, N, C},
        {"fc_proj input gradient, DGELU", CUBLASLT_EPILOGUE_DGELU, false, H, N, C},
        {"fc_proj input gradient, DGELU, weight transposed", CUBLASLT_EPILOGUE_DGELU, true, H, N, C},
        {"fc_proj input gradient, no epilogue, weight transposed", CUBLASLT_EPILOGUE_DEFAULT, true, H, N, C},
        {"fc_proj input gradient, DGELU_BGRAD", CUBLASLT_EPILOGUE_DGELU_BGRAD, false, H, N, C},
        {"fc_proj input gradient, no epilogue", CUBLASLT_EPILOGUE_DEFAULT, false, H, N, C},
        {"fc_proj forward, BIAS", CUBLASLT_EPILOGUE_BIAS, true, C, N, H},
        {"qkv forward, BIAS", CUBLASLT_EPILOGUE_BIAS, true, 3 * C, N, C},
    });
  }
  // Each shape sized for the whole device and for the multiprocessors that the overlapped
  // lane's 4 CTAs leave (cuBLASLt's SM count target, CudaOps::reserve_multiprocessors).
  for (const int target : {0, multiprocessors - 4})
  for (const Shape& shape : shapes) {
    const bool has_bias = shape.epilogue == CUBLASLT_EPILOGUE_BIAS ||
                          shape.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS ||
                          shape.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                          shape.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const bool has_aux = shape.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                         shape.epilogue == CUBLASLT_EPILOGUE_DGELU ||
                         shape.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    LtGemmShape gemm{shape.transposed_a ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, shape.m, shape.n, shape.k,
                     shape.transposed_a ? shape.k : shape.m, shape.k, shape.m};
    gemm.epilogue = shape.epilogue;
    gemm.bias = has_bias ? bias : nullptr;
    gemm.aux = has_aux ? aux : nullptr;
    gemm.multiprocessor_target = target;
    const LtCandidates candidates(handle, gemm, workspace_bytes, 32);
    const double flops = 2.0 * shape.m * shape.n * shape.k;
    std::cout << "  " << shape.name << " (m=" << shape.m << " n=" << shape.n << " k=" << shape.k
              << ", sized for " << (target > 0 ? target : multiprocessors) << " multiprocessors): "
              << candidates.count() << " candidates\n";
    for (int i = 0; i < candidates.count(); ++i) {
      std::cout << "    #" << i << " " << candidates.config(i);
      const auto call = [&] { candidates.run(i, a, b, 0.0f, d, workspace, workspace_bytes, gpu_->stream()); };
      const double ms = median_ms(*gpu_, 10, call);
      // The energy of the first three only: it takes a second a candidate.
      std::cout << ": " << ms << " ms, " << flops / ms / 1e9 << " TFLOP/s"
                << (i < 3 ? energy_suffix(gpu_->stream(), ms, call) : std::string()) << "\n";
    }
  }
  CHECK_CUBLAS(cublasLtDestroy(handle));
  for (void* buffer : {a, b, d, aux, bias, workspace}) CHECK_CUDA(cudaFree(buffer));
}

// Median milliseconds of `run` on `stream` over `repeats` runs after `warmups`.
template <class Run>
double median_ms(cudaStream_t stream, int warmups, int repeats, Run run) {
  for (int i = 0; i < warmups; ++i) run();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> times(repeats);
  for (float& time : times) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    run();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&time, start, stop));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[repeats / 2];
}

// GPT-2 small's attention at batch 8, sequence 1024, bf16: the flash kernels against the
// cuBLAS path (strided-batched GEMMs and softmax row kernels over [B,NH,T,T]).
TEST_F(FlashAttentionTest, TimingAgainstCublasPath) {
  const AttentionShape shape{8, 1024, 768, 12, true};
  const Precision precision = Precision::bf16;
  const size_t tokens = size_t(shape.batch) * shape.seq, C = shape.channels;
  const size_t probs_elems = tokens * shape.heads * shape.seq;
  DeviceBuffer qkv(tokens * 3 * C * 2), out(tokens * C * 2), dout(tokens * C * 2);
  DeviceBuffer dqkv(tokens * 3 * C * 2), lse(tokens * shape.heads * 4);
  DeviceBuffer flash_scratch(cuda::flash_attention_backward_scratch_elems(shape) * 4);
  upload_half(qkv, precision, random_floats(tokens * 3 * C, 90));
  upload_half(dout, precision, random_floats(tokens * C, 91));
  upload_half(dqkv, precision, std::vector<float>(tokens * 3 * C, 0.0f));
  auto flash_step = [&] {
    flash_forward(precision, stream_, out, lse, qkv, shape);
    flash_backward(precision, stream_, {dqkv, dout, qkv, out, lse}, shape, flash_scratch);
  };
  const double flash_forward_ms =
      median_ms(stream_, 3, 20, [&] { flash_forward(precision, stream_, out, lse, qkv, shape); });
  const double flash_ms = median_ms(stream_, 3, 20, flash_step);

  cublasHandle_t handle = nullptr;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream_));
  // The forward's and the backward's scratch are used one after the other on one stream.
  const size_t scratch_elems = std::max(cuda::attention_forward_scratch_elems_16bit(shape),
                                        cuda::attention_backward_scratch_elems_16bit(shape));
  DeviceBuffer probs(probs_elems * 2), scratch(scratch_elems * 4);
  auto cublas_step = [&] {
    const cuda::Scratch device_scratch{scratch.as<float>(), scratch_elems};
    cuda::launch_attention_forward(handle, stream_, out.as<__nv_bfloat16>(),
                                   probs.as<__nv_bfloat16>(), qkv.as<__nv_bfloat16>(), shape,
                                   device_scratch);
    cuda::launch_attention_backward(handle, stream_,
                                    AttentionBackwardArgs<__nv_bfloat16>{
                                        .dqkv = dqkv.as<__nv_bfloat16>(),
                                        .dout = dout.as<__nv_bfloat16>(),
                                        .qkv = qkv.as<__nv_bfloat16>(),
                                        .state = probs.as<__nv_bfloat16>(),
                                        .shape = shape},
                                    device_scratch);
  };
  const double cublas_ms = median_ms(stream_, 3, 20, cublas_step);
  CHECK_CUBLAS(cublasDestroy(handle));

  // Causal FLOPs: 2 products of B*NH*T*T/2*HS multiply-adds forward, 5 backward (the
  // flash backward recomputes S and, in its dQ pass, S and dP once more: 7 executed).
  const double half_pairs = double(shape.batch) * shape.heads * shape.seq * shape.seq / 2.0;
  const double forward_flops = 2.0 * 2.0 * half_pairs * (C / shape.heads);
  std::cout << "flash attention fwd+bwd " << flash_ms << " ms, cuBLAS path " << cublas_ms
            << " ms, speedup " << cublas_ms / flash_ms << "\n";
  std::cout << "  flash forward " << flash_forward_ms << " ms ("
            << forward_flops / flash_forward_ms * 1e-9 << " TFLOP/s), backward "
            << flash_ms - flash_forward_ms << " ms ("
            << 3.5 * forward_flops / (flash_ms - flash_forward_ms) * 1e-9
            << " TFLOP/s executed)\n";
}

SCALESTUDY_HALF_PRECISION_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
