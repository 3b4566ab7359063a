// The optimizer's ops of the CUDA backend against the CPU reference: the sums in double,
// AdamW bit for bit, AdamW over a model's pieces in one launch, and the 16-bit copy that
// launch refreshes.
#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {
namespace {

TEST_F(CudaOpsTest, SumsInDoubleAreAccurateAndDeterministic) {
  EXPECT_EQ(gpu_->sum(nullptr, 0), 0.0);
  EXPECT_EQ(gpu_->sum_of_squares(nullptr, 0), 0.0);
  for (size_t elems : {size_t{1}, size_t{33}, size_t{1000}, size_t{262147}, size_t{1000003}}) {
    const auto x = random_floats(elems, 80 + elems, -1.0f, 3.0f);
    const float* d_x = upload(x);
    double magnitude = 0.0, squares_magnitude = 0.0;
    for (float value : x) {
      magnitude += std::fabs(value);
      squares_magnitude += double{value} * value;
    }
    const std::string label = " of " + std::to_string(elems);
    const double gpu_sum = gpu_->sum(d_x, elems), gpu_squares = gpu_->sum_of_squares(d_x, elems);
    EXPECT_TRUE(all_close("sum" + label, std::vector<double>{gpu_sum},
                          std::vector<double>{cpu_.sum(x.data(), elems)},
                          Tolerance{kDoubleSumRelative * magnitude, 0.0}));
    EXPECT_TRUE(all_close("sum_of_squares" + label, std::vector<double>{gpu_squares},
                          std::vector<double>{cpu_.sum_of_squares(x.data(), elems)},
                          Tolerance{kDoubleSumRelative * squares_magnitude, 0.0}));
    EXPECT_EQ(gpu_->sum(d_x, elems), gpu_sum) << "repeated sums must be bit-identical";
    EXPECT_EQ(gpu_->sum_of_squares(d_x, elems), gpu_squares);
  }
}

// AdamW's fp32 state, random from three seeds on, on the host and on the GPU.
struct AdamWState {
  std::vector<float> params, m, v;
  float *d_params = nullptr, *d_m = nullptr, *d_v = nullptr;
};

class CudaOpsAdamW : public CudaOpsTest {
 protected:
  AdamWState state(size_t elems, uint64_t seed) {
    AdamWState state;
    state.params = random_floats(elems, seed);
    state.m = random_floats(elems, seed + 1, -0.1f, 0.1f);
    state.v = random_floats(elems, seed + 2, 0.0f, 0.01f);
    state.d_params = upload(state.params);
    state.d_m = upload(state.m);
    state.d_v = upload(state.v);
    return state;
  }
  static AdamWParams hyper(int step, float weight_decay) {
    AdamWParams hyper;
    hyper.learning_rate = 3e-3f;
    hyper.weight_decay = weight_decay;
    hyper.step = step;
    return hyper;
  }
  // Every AdamW step here is the CPU's, bit for bit.
  void expect_same_state(const std::string& what, const AdamWState& state) {
    EXPECT_TRUE(matches(what + " params", state.d_params, state.params, kBitExact));
    EXPECT_TRUE(matches(what + " m", state.d_m, state.m, kBitExact));
    EXPECT_TRUE(matches(what + " v", state.d_v, state.v, kBitExact));
  }
};

TEST_F(CudaOpsAdamW, AdamWStepsAreBitIdentical) {
  const size_t elems = 100003;
  AdamWState s = state(elems, 90);
  for (int step = 1; step <= 3; ++step) {
    const AdamWParams step_hyper = hyper(step, step == 2 ? 0.0f : 0.1f);
    const auto grads = random_floats(elems, 93 + step);
    cpu_.adamw_update(s.params.data(), grads.data(), s.m.data(), s.v.data(), elems, step_hyper);
    gpu_->adamw_update(s.d_params, upload(grads), s.d_m, s.d_v, elems, step_hyper);
    expect_same_state("adamw after step " + std::to_string(step), s);
  }
}

// The one-launch AdamW over a model's pieces against the CPU's piece-by-piece steps: the
// pieces' sizes straddle the kernel's tiles (2048 elements) or fall far inside one, and
// empty pieces are left out of the launch.
TEST_F(CudaOpsAdamW, AdamWOverPiecesIsThePieceByPieceStep) {
  const std::vector<AdamWPiece> pieces = {{0, 768, 0.0f},          {768, 768, 0.1f},
                                          {768, 3 * 2048 + 5, 0.1f}, {3 * 2048 + 5, 3 * 2048 + 6, 0.0f},
                                          {3 * 2048 + 6, 40000, 0.1f}, {40000, 41001, 0.0f}};
  const size_t elems = pieces.back().end_elems;
  AdamWState s = state(elems, 94);
  for (int step = 1; step <= 2; ++step) {
    const AdamWParams step_hyper = hyper(step, 0.5f);  // each piece's own decay replaces it
    const auto grads = random_floats(elems, 97 + step);
    EXPECT_FALSE(cpu_.adamw_update_pieces(s.params.data(), grads.data(), s.m.data(), s.v.data(),
                                          pieces, step_hyper));
    EXPECT_FALSE(gpu_->adamw_update_pieces(s.d_params, upload(grads), s.d_m, s.d_v, pieces,
                                           step_hyper))
        << "fp32 has no compute copy to refresh";
    expect_same_state("adamw pieces after step " + std::to_string(step), s);
  }
}

// In bf16 and fp16 the pieces' step writes the parameters' 16-bit copy as it goes: a GEMM
// that reads the copy then gives the same bits as after parameters_changed's cast.
TEST_F(CudaOpsTest, AdamWOverPiecesRefreshesTheComputeCopy) {
  for (Precision precision : {Precision::bf16, Precision::fp16}) {
    CudaOps half(0, precision);
    const int rows = 64, in_channels = 256, out_channels = 128;
    const size_t weight_elems = size_t(in_channels) * out_channels;
    const std::vector<AdamWPiece> pieces = {{0, weight_elems / 2, 0.1f}, {weight_elems / 2, weight_elems, 0.0f}};
    std::vector<float*> owned;
    auto device = [&](const std::vector<float>& host, MemoryKind kind) {
      float* p = half.allocate_floats(host.size(), kind);
      half.copy_from_host(p, host.data(), host.size());
      owned.push_back(p);
      return p;
    };
    const auto params = random_floats(weight_elems, 110), grads = random_floats(weight_elems, 111);
    const auto moments = random_floats(weight_elems, 112, 0.0f, 0.01f);
    float* fused = device(params, MemoryKind::parameters);
    float* cast = device(params, MemoryKind::parameters);
    half.parameters_changed(fused, 0, weight_elems);
    half.parameters_changed(cast, 0, weight_elems);
    float *d_grads = device(grads, MemoryKind::gradients), *m1 = device(moments, MemoryKind::optimizer);
    float *v1 = device(moments, MemoryKind::optimizer), *m2 = device(moments, MemoryKind::optimizer);
    float* v2 = device(moments, MemoryKind::optimizer);
    AdamWParams hyper;
    hyper.learning_rate = 0.05f;  // large enough that every 16-bit weight moves
    hyper.step = 1;
    EXPECT_TRUE(half.adamw_update_pieces(fused, d_grads, m1, v1, pieces, hyper))
        << precision_name(precision) << ": the copy is written in the same pass";
    for (const AdamWPiece& piece : pieces) {
      AdamWParams piece_hyper = hyper;
      piece_hyper.weight_decay = piece.weight_decay;
      half.adamw_update(cast + piece.begin_elems, d_grads + piece.begin_elems, m2 + piece.begin_elems,
                        v2 + piece.begin_elems, piece.end_elems - piece.begin_elems, piece_hyper);
    }
    half.parameters_changed(cast, 0, weight_elems);
    const auto inp = random_floats(size_t(rows) * in_channels, 113);
    float* d_inp = device(inp, MemoryKind::activations);
    float* out_fused = device(std::vector<float>(size_t(rows) * out_channels), MemoryKind::activations);
    float* out_cast = device(std::vector<float>(size_t(rows) * out_channels), MemoryKind::activations);
    half.matmul_forward({.out = out_fused, .inp = d_inp, .weight = fused, .rows = rows,
                         .in_channels = in_channels, .out_channels = out_channels});
    half.matmul_forward({.out = out_cast, .inp = d_inp, .weight = cast, .rows = rows,
                         .in_channels = in_channels, .out_channels = out_channels});
    std::vector<float> got(size_t(rows) * out_channels), want(got.size()), master(weight_elems), reference(weight_elems);
    half.copy_to_host(got.data(), out_fused, got.size());
    half.copy_to_host(want.data(), out_cast, want.size());
    half.copy_to_host(master.data(), fused, weight_elems);
    half.copy_to_host(reference.data(), cast, weight_elems);
    EXPECT_TRUE(all_close(std::string(precision_name(precision)) + " masters", master, reference, kBitExact));
    EXPECT_TRUE(all_close(std::string(precision_name(precision)) + " GEMM from the written copy", got, want,
                          kBitExact));
    for (float* p : owned) half.release(p);
  }
}



}  // namespace
}  // namespace scalestudy::gpu_test
