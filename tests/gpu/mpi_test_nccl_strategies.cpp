// On 2 GPUs: ddp, ddp+overlap, zero2 and zero2+overlap over NCCL train the same model as
// each other and as the one-rank CPU reference; the NCCL communicator's bf16 sums are
// the MPI communicator's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl_communicator.h"
#include "comm/nccl_transport.h"
#include "config/run_config.h"
#include "cuda_check.h"
#include "forwarding_communicator.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

constexpr int kSteps = 5;
// Strategies against each other on the GPUs: the same kernels, NCCL sums in different
// orders (allreduce against reduce-scatter), so only the last bits differ, as on the CPU.
constexpr double kStrategyRtol = 1e-5, kStrategyAtol = 1e-6;
// GPU against the CPU reference: cuBLAS and the CPU add the dot products in different
// orders (~1e-6 relative per op); five AdamW steps carry that through as ~lr*1e-3.
constexpr double kCpuRtol = 1e-3, kCpuAtol = 1e-5;
// bf16 compute: a last-bit difference in a master weight can flip its bf16 copy by one
// ulp (2^-8 relative), so runs differ per element by up to a few AdamW steps of lr.
// The updates must still agree as vectors: ||Δ_a - Δ_b|| / ||Δ_b|| (Δ = params - initial
// params) is at most kBf16UpdateTolerance, between strategies and against the fp32 CPU.
constexpr double kBf16StrategyUpdateTolerance = 2e-2;
constexpr double kBf16CpuUpdateTolerance = 1e-1;

bool have_two_gpus() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int visible = cuda_device_count();
  int local_ok = visible >= 1 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return world == 2 && all_ok == 1;
}

RunConfig make_config(const std::string& backend, const std::string& strategy, const std::string& overlap,
                      const std::string& precision = "fp32") {
  const std::vector<std::string> args = {"--model", "tiny", "--layers", "3", "--hidden", "64",
                                         "--heads", "4", "--vocab", "128", "--seq", "32", "--global-batch", "8",
                                         "--steps", std::to_string(kSteps), "--warmup-steps", "0",
                                         "--strategy", strategy, "--overlap", overlap, "--bucket-mb", "0.05",
                                         "--backend", backend, "--check-every", "1", "--lr", "1e-3",
                                         "--precision", precision};
  return parse_train_options(args);
}

struct GpuRun {
  std::vector<float> initial, final;
  size_t overlapped_calls = 0;  // NCCL calls on the overlapped lane's communicator
};

// A communicator that passes every call to another, and tells the strategies to size the
// GPU's kernels as beside an overlapped lane of `reported` CTAs, whether that communicator
// has one or not.
class LaneReportingCommunicator final : public ForwardingCommunicator {
 public:
  LaneReportingCommunicator(Communicator& inner, int reported) : ForwardingCommunicator(inner), reported_(reported) {}
  int overlapped_lane_multiprocessors() const override { return reported_; }

 private:
  int reported_;
};

// reported_multiprocessors >= 0 overrides the communicator's overlapped_lane_multiprocessors;
// overlap_after >= 0 overrides --overlap-after auto.
GpuRun train_on_gpus(const std::string& strategy, const std::string& overlap, Precision precision = Precision::fp32,
                     Precision grad_reduce = Precision::fp32, int overlapped_ctas = 0,
                     int reported_multiprocessors = -1, double overlap_after = -1.0) {
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  RunConfig config = make_config("cuda", strategy, overlap, precision_name(precision));
  // The GEMMs pick their algorithms as a run with the default --gemm-algos does.
  CudaOps ops(where.local_rank, precision, config.gemm_algos);
  NcclCommunicator nccl(MPI_COMM_WORLD, ops.stream(), 120.0, overlapped_ctas);
  LaneReportingCommunicator comm(nccl, reported_multiprocessors >= 0 ? reported_multiprocessors
                                                                     : nccl.overlapped_lane_multiprocessors());
  config.grad_reduce = grad_reduce;
  config.overlapped_ctas = overlapped_ctas;
  if (overlap_after >= 0) {
    config.overlap_after = overlap_after;
    config.overlap_after_auto = false;
  }
  Trainer trainer(config, ops, comm, MPI_COMM_WORLD);
  GpuRun run;
  run.initial = trainer.parameters_on_host();
  trainer.run(nullptr);
  run.final = trainer.parameters_on_host();
  run.overlapped_calls = nccl.overlapped_calls();
  return run;
}

// ||(a - initial) - (b - initial)|| / ||b - initial||
double update_difference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& initial) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double da = static_cast<double>(a[i]) - initial[i], db = static_cast<double>(b[i]) - initial[i];
    diff += (da - db) * (da - db);
    norm += db * db;
  }
  return std::sqrt(diff / norm);
}

const std::vector<float>& cpu_reference() {
  static const std::vector<float> reference = [] {
    CpuOps ops;
    MpiCommunicator comm(MPI_COMM_SELF, 120.0);
    Trainer trainer(make_config("cpu", "ddp", "off"), ops, comm, MPI_COMM_SELF);
    trainer.run(nullptr);
    return trainer.parameters_on_host();
  }();
  return reference;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(static_cast<double>(got[i]) - ref[i]) > atol + rtol * std::fabs(ref[i]) || std::isnan(got[i])) {
      if (mismatches++ == 0)
        ADD_FAILURE() << what << ": first mismatch at parameter " << i << ": " << got[i] << " vs " << ref[i];
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

TEST(NcclStrategies, AllStrategiesAgreeWithEachOtherAndWithTheCpu) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const std::vector<float> ddp = train_on_gpus("ddp", "off").final;
  expect_close(ddp, cpu_reference(), kCpuRtol, kCpuAtol, "ddp on 2 GPUs against the CPU");
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "on"}, {"zero2", "off"}, {"zero2", "on"}}) {
    const std::vector<float> params = train_on_gpus(strategy, overlap).final;
    expect_close(params, ddp, kStrategyRtol, kStrategyAtol, strategy + " overlap " + overlap + " against ddp");
  }
  // With an overlapped lane of 2 CTAs, whose GEMMs are sized for the multiprocessors left:
  // other GEMM kernels add the dot products in other orders, as cuBLAS and the CPU do, so
  // within the CPU comparison's bounds (a few of the tiny model's parameters, near zero
  // after AdamW, differ from ddp's by about 1e-6, beyond kStrategyAtol).
  for (const std::string strategy : {"ddp", "zero2"}) {
    const std::vector<float> params = train_on_gpus(strategy, "on", Precision::fp32, Precision::fp32, 2).final;
    expect_close(params, ddp, kCpuRtol, kCpuAtol, strategy + " overlap on, 2 overlapped CTAs, against ddp");
  }
}

TEST(NcclStrategies, Bf16StrategiesAgreeWithEachOtherAndWithTheCpu) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const GpuRun ddp = train_on_gpus("ddp", "off", Precision::bf16);
  ASSERT_EQ(ddp.initial.size(), cpu_reference().size());
  const double against_cpu = update_difference(ddp.final, cpu_reference(), ddp.initial);
  EXPECT_LE(against_cpu, kBf16CpuUpdateTolerance) << "bf16 ddp on 2 GPUs against the fp32 CPU run";
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "on"}, {"zero2", "off"}, {"zero2", "on"}}) {
    const GpuRun run = train_on_gpus(strategy, overlap, Precision::bf16);
    const double difference = update_difference(run.final, ddp.final, ddp.initial);
    EXPECT_LE(difference, kBf16StrategyUpdateTolerance) << strategy << " overlap " << overlap << " bf16 against ddp";
    if (::testing::Test::HasFailure()) break;
  }
}

// The overlapped lane's NCCL communicator runs the same sums with fewer CTAs: on two ranks
// each is one addition, so training is bit for bit the one-lane run's, when that run's GEMMs
// are sized for the same multiprocessors (a GEMM sized for fewer may sum in another order).
TEST(NcclStrategies, OverlappedLaneTrainsBitForBitAsOneLane) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  for (const std::string strategy : {"ddp", "zero2"}) {
    const GpuRun one = train_on_gpus(strategy, "on", Precision::fp32, Precision::fp32, 0, 2);
    const GpuRun two = train_on_gpus(strategy, "on", Precision::fp32, Precision::fp32, 2);
    EXPECT_EQ(one.overlapped_calls, 0u);
    EXPECT_GT(two.overlapped_calls, 0u) << strategy << ": no bucket ran in the overlapped lane";
    ASSERT_EQ(two.final.size(), one.final.size());
    size_t differing = 0;
    for (size_t i = 0; i < one.final.size(); ++i) differing += two.final[i] != one.final[i];
    EXPECT_EQ(differing, 0u) << strategy << " overlap on, --overlapped-ctas 2: parameters that differ";
  }
}

// --overlap-after changes when the buckets start, not what they sum: with no overlapped
// lane every GEMM keeps the whole GPU either way, so training is bit for bit the same.
TEST(NcclStrategies, HeldBucketsTrainBitForBitAsUnheld) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  for (const std::string strategy : {"ddp", "zero2"})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      const std::vector<float> unheld =
          train_on_gpus(strategy, "on", precision, Precision::fp32, 0, -1, 0.0).final;
      const std::vector<float> held =
          train_on_gpus(strategy, "on", precision, Precision::fp32, 0, -1, 0.5).final;
      ASSERT_EQ(held.size(), unheld.size());
      size_t differing = 0;
      for (size_t i = 0; i < held.size(); ++i) differing += held[i] != unheld[i];
      EXPECT_EQ(differing, 0u) << strategy << " overlap on, " << precision_name(precision)
                               << ", --overlap-after 0.5: parameters that differ";
    }
}

// --grad-reduce bf16 on 2 GPUs against the fp32 CPU reference, with the bounds (and
// their reasons) of tests/mpi/test_strategies.cpp: the 99th percentile of the parameter
// differences within kSteps * lr * 2^-5, every one within 2 * kSteps * lr; and the
// rounding happened (most parameters differ from the fp32-reduced GPU run).
TEST(NcclStrategies, GradReduceBf16StaysWithinBf16RoundingOfTheCpu) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  constexpr double kLearningRate = 1e-3;  // make_config's --lr
  const std::vector<float>& ref = cpu_reference();
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "off"}, {"ddp", "on"}, {"zero2", "on"}}) {
    const std::string label = strategy + " overlap " + overlap + ", --grad-reduce bf16";
    const std::vector<float> bf16 = train_on_gpus(strategy, overlap, Precision::fp32, Precision::bf16).final;
    ASSERT_EQ(bf16.size(), ref.size());
    std::vector<double> diffs(bf16.size());
    for (size_t i = 0; i < bf16.size(); ++i) diffs[i] = std::fabs(static_cast<double>(bf16[i]) - ref[i]);
    std::sort(diffs.begin(), diffs.end());
    EXPECT_LE(diffs[diffs.size() * 99 / 100], kSteps * kLearningRate * 0x1p-5) << label << ": 99th percentile";
    EXPECT_LE(diffs.back(), 2.0 * kSteps * kLearningRate) << label << ": largest difference";
    const std::vector<float> fp32 = train_on_gpus(strategy, overlap).final;
    size_t differing = 0;
    for (size_t i = 0; i < fp32.size(); ++i) differing += fp32[i] != bf16[i];
    EXPECT_GT(differing, fp32.size() / 2) << label << ": parameters that differ from the fp32-reduced run";
  }
}

// This rank's GPU made current, and a stream on it, for the tests on raw device buffers.
struct RankDevice {
  RankDevice() : where(discover_placement(MPI_COMM_WORLD)) {
    CHECK_CUDA(cudaSetDevice(where.local_rank));
    CHECK_CUDA(cudaStreamCreate(&stream));
  }
  ~RankDevice() { CHECK_CUDA(cudaStreamDestroy(stream)); }
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;
  ProcessPlacement where;
  cudaStream_t stream = nullptr;
};

// The bf16 sums on device buffers, with the inputs of tests/mpi/test_communicator.cpp:
// integers plus 2^-10, which bf16 rounds away, so the exact integer sums come back only
// if each rank's values were rounded first; and 1 + 2^-8, a tie that rounds to 1. The
// allreduce is longer than one staging piece, so it also runs in two pieces.
TEST(NcclCommunicator, Bf16SumsRoundLikeTheMpiCommunicator) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const RankDevice device;
  const cudaStream_t stream = device.stream;
  const int rank = device.where.rank;
  const size_t elems = Bf16WireStaging::kPieceElems + 1000;
  std::vector<float> host(elems);
  for (size_t i = 0; i < elems; ++i) host[i] = static_cast<float>((rank + 1) * (i % 7 + 1)) + 0x1p-10f;
  const size_t recv_elems = 4099;
  std::vector<float> send_host(2 * recv_elems);
  for (size_t i = 0; i < send_host.size(); ++i)
    send_host[i] = static_cast<float>((rank + 1) * (i / recv_elems + 1) + i % 5) + 0x1p-10f;
  float *buffer = nullptr, *send = nullptr, *recv = nullptr, *tie = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, elems * 4));
  CHECK_CUDA(cudaMalloc(&send, send_host.size() * 4));
  CHECK_CUDA(cudaMalloc(&recv, recv_elems * 4));
  CHECK_CUDA(cudaMalloc(&tie, 64 * 4));
  CHECK_CUDA(cudaMemcpy(buffer, host.data(), elems * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(send, send_host.data(), send_host.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<float> tie_host(64, rank == 0 ? 1.0f : 0x1p-8f);
  CHECK_CUDA(cudaMemcpy(tie, tie_host.data(), 64 * 4, cudaMemcpyHostToDevice));
  {
    NcclCommunicator comm(MPI_COMM_WORLD, stream, 120.0);
    comm.start_allreduce(in_place(buffer, elems, "test", WireType::bf16_from_f32));
    comm.start_reduce_scatter(collective_args(send, recv, recv_elems, "test", WireType::bf16_from_f32));
    comm.start_allreduce(in_place(tie, 64, "test", WireType::bf16_from_f32));
    comm.finish_all();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::vector<CollectiveRecord> records = comm.take_records();
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(records[0].payload_bytes, elems * 2) << "bf16 collectives send 2 bytes per element";
  }
  CHECK_CUDA(cudaMemcpy(host.data(), buffer, elems * 4, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (size_t i = 0; i < elems; ++i) wrong += host[i] != 3.0f * static_cast<float>(i % 7 + 1);
  EXPECT_EQ(wrong, 0u) << "allreduce in bf16: elements not the exact integer sum";
  std::vector<float> got(recv_elems);
  CHECK_CUDA(cudaMemcpy(got.data(), recv, recv_elems * 4, cudaMemcpyDeviceToHost));
  wrong = 0;
  for (size_t i = 0; i < recv_elems; ++i) {
    const size_t j = static_cast<size_t>(rank) * recv_elems + i;  // this rank's chunk
    wrong += got[i] != static_cast<float>(3 * (rank + 1) + 2 * (j % 5));
  }
  EXPECT_EQ(wrong, 0u) << "reduce_scatter in bf16: elements not the exact integer sum";
  std::vector<float> tie_got(64);
  CHECK_CUDA(cudaMemcpy(tie_got.data(), tie, 64 * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(tie_got.begin(), tie_got.end(), 1.0f), 64) << "1 + 2^-8 in bf16 is 1";
  for (float* p : {buffer, send, recv, tie}) CHECK_CUDA(cudaFree(p));
}

// Host doubles (zero2's gradient norm) are summed over the ranks on the host, exactly for
// these integers, and recorded as one allreduce of their bytes.
TEST(NcclCommunicator, HostDoublesSumExactlyAndAreRecorded) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const RankDevice device;
  const int rank = device.where.rank;
  std::vector<double> values(5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = (rank + 1) * 1000.0 + static_cast<double>(i);
  NcclCommunicator comm(MPI_COMM_WORLD, device.stream, 120.0);
  comm.finish(comm.start_allreduce(in_place(values.data(), values.size(), "norm")));
  comm.finish_all();
  CHECK_CUDA(cudaStreamSynchronize(device.stream));
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(values[i], 3000.0 + 2.0 * static_cast<double>(i)) << "element " << i;
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, CollectiveKind::allreduce);
  EXPECT_EQ(records[0].payload_bytes, values.size() * sizeof(double));
  EXPECT_LE(records[0].begin_s, records[0].end_s);
}

// The transports come from NCCL's own log of this communicator's connections: on two
// GPUs something NCCL connected them through (P2P over NVLink or PCIe, SHM, or a network),
// never "none", and "unknown" only where the user keeps NCCL's log.
TEST(NcclCommunicator, MeasuresTheTransportsNcclConnectedThrough) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  if (!NcclLog::instance().capturing())
    GTEST_SKIP() << "the transports are unknown by design here: " << NcclLog::instance().why_not();
  const RankDevice device;
  NcclCommunicator comm(MPI_COMM_WORLD, device.stream, 120.0);
  ASSERT_NE(comm.transports(), "unknown") << comm.transports_unknown_why();
  ASSERT_NE(comm.transports(), "none");
  const std::string list = comm.transports();
  for (size_t begin = 0; begin < list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string one = list.substr(begin, end - begin);
    EXPECT_TRUE(one == "P2P" || one == "SHM" || one == "NVLS" || one == "CollNet" || one.rfind("NET/", 0) == 0)
        << "rank " << device.where.rank << ": " << one << " in " << list;
    begin = end + 1;
  }
}

// One finish() of the latest collective makes compute wait for all of them (they run in
// the order started), and only that one records a wait.
TEST(NcclCommunicator, FinishingTheLatestCoversTheEarlierOnes) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const RankDevice device;
  const int rank = device.where.rank;
  constexpr int kCollectives = 3;
  constexpr size_t kElems = 1 << 20;
  std::vector<float*> buffers(kCollectives);
  std::vector<float> host(kElems);
  std::vector<CommHandle> handles;
  NcclCommunicator comm(MPI_COMM_WORLD, device.stream, 120.0);
  for (int c = 0; c < kCollectives; ++c) {
    CHECK_CUDA(cudaMalloc(&buffers[c], kElems * 4));
    std::fill(host.begin(), host.end(), static_cast<float>((rank + 1) * (c + 1)));
    CHECK_CUDA(cudaMemcpy(buffers[c], host.data(), kElems * 4, cudaMemcpyHostToDevice));
    handles.push_back(comm.start_allreduce(in_place(buffers[c], kElems, "test")));
  }
  comm.finish(handles.back());
  // Compute's stream order alone, after the wait, must see every sum.
  std::vector<float> sums(kCollectives);
  for (int c = 0; c < kCollectives; ++c)
    CHECK_CUDA(cudaMemcpyAsync(&sums[c], buffers[c] + kElems - 1, 4, cudaMemcpyDeviceToHost, device.stream));
  CHECK_CUDA(cudaStreamSynchronize(device.stream));
  for (int c = 0; c < kCollectives; ++c) EXPECT_EQ(sums[c], 3.0f * static_cast<float>(c + 1)) << "collective " << c;
  comm.finish(handles.front());  // covered already: records nothing more
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), static_cast<size_t>(kCollectives));
  for (int c = 0; c + 1 < kCollectives; ++c)
    EXPECT_TRUE(std::isnan(records[c].wait_begin_s)) << "collective " << c << " recorded a wait of its own";
  EXPECT_FALSE(std::isnan(records.back().wait_begin_s));
  EXPECT_LE(records.back().wait_begin_s, records.back().wait_end_s);
  for (float* buffer : buffers) CHECK_CUDA(cudaFree(buffer));
}

}  // namespace
}  // namespace scalestudy
