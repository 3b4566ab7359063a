// Bf16WireStaging on one GPU: it grows to the largest piece asked for and never shrinks;
// values go onto the wire rounded to bf16 (to nearest even) at the offset asked for, and
// come back widened exactly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "backend/cuda/device_info.h"
#include "comm/bf16_wire_staging.h"
#include "cuda_check.h"

namespace scalestudy {
namespace {

class Bf16WireStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) CHECK_CUDA(cudaStreamDestroy(stream_));
  }
  float* upload(const std::vector<float>& host) {
    float* device = nullptr;
    CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    buffers_.push_back(device);
    return device;
  }
  std::vector<float> download(const float* device, size_t elems) {
    std::vector<float> host(elems);
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    CHECK_CUDA(cudaMemcpy(host.data(), device, elems * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }
  ~Bf16WireStagingTest() override {
    for (float* buffer : buffers_) cudaFree(buffer);
  }

  cudaStream_t stream_ = nullptr;
  std::vector<float*> buffers_;
};

TEST_F(Bf16WireStagingTest, GrowsToTheLargestPieceAskedFor) {
  Bf16WireStaging wire(stream_);
  EXPECT_EQ(wire.bytes(), 0u);
  wire.reserve(1000);
  EXPECT_EQ(wire.elems(), 1000u);
  EXPECT_EQ(wire.bytes(), 2000u);
  const __nv_bfloat16* first = wire.at();
  wire.reserve(10);
  EXPECT_EQ(wire.elems(), 1000u) << "reserving less shrinks the buffer";
  EXPECT_EQ(wire.at(), first) << "reserving less moves the buffer";
  wire.reserve(4096);
  EXPECT_EQ(wire.bytes(), 8192u);
}

// 1 + 2^-10 rounds to 1 in bf16 (8 significant bits); 1 + 2^-8 is a tie that rounds to the
// even 1; 1 + 3 * 2^-8 is a tie that rounds up to 1 + 2^-6; small integers are exact.
TEST_F(Bf16WireStagingTest, RoundsOnTheWayInAndWidensExactlyOnTheWayOut) {
  const std::vector<float> values = {1.0f + 0x1p-10f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 7.0f, -250.0f, 0.5f};
  const std::vector<float> rounded = {1.0f, 1.0f, 1.0f + 0x1p-6f, 7.0f, -250.0f, 0.5f};
  const float* in = upload(values);
  float* out = upload(std::vector<float>(values.size(), -1.0f));
  Bf16WireStaging wire(stream_);
  wire.reserve(3 * values.size());
  wire.to_wire(in, values.size(), 2 * values.size());  // at an offset, as a rank's chunk
  wire.from_wire(out, values.size(), 2 * values.size());
  const std::vector<float> got = download(out, values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], rounded[i]) << "element " << i;
}

TEST_F(Bf16WireStagingTest, CutsCollectivesIntoPiecesOfAtMostThePieceSize) {
  std::vector<std::pair<size_t, size_t>> pieces;
  Bf16WireStaging::for_each_piece(2 * Bf16WireStaging::kPieceElems + 5,
                                  [&](size_t offset, size_t piece) { pieces.emplace_back(offset, piece); });
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], std::make_pair(size_t{0}, Bf16WireStaging::kPieceElems));
  EXPECT_EQ(pieces[1], std::make_pair(Bf16WireStaging::kPieceElems, Bf16WireStaging::kPieceElems));
  EXPECT_EQ(pieces[2], std::make_pair(2 * Bf16WireStaging::kPieceElems, size_t{5}));
  pieces.clear();
  Bf16WireStaging::for_each_piece(0, [&](size_t offset, size_t piece) { pieces.emplace_back(offset, piece); });
  EXPECT_TRUE(pieces.empty());
}

}  // namespace
}  // namespace scalestudy
