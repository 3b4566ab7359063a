#pragma once
// The micro-benchmarks of `scalestudy bench <name>`: each one's entry point, what it
// measures and how its rate is defined, and the pieces of it that the tests check against
// known answers. Each benchmark's code is in bench_<name>.cpp.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/bench_model.h"
#include "comm/communicator.h"

namespace scalestudy {

// ---- gemm -------------------------------------------------------------------------------
// `scalestudy bench gemm`: TFLOP/s of square n×n×n matrix products, C = A·B, per
// precision. On cuda, cublasGemmEx directly: fp32 (CUBLAS_COMPUTE_32F), tf32
// (CUBLAS_COMPUTE_32F_FAST_TF32, fp32 storage), fp16 and bf16 (16-bit A, B and C,
// fp32 accumulation). On the cpu, the reference backend's matmul_forward in fp32; the
// other precisions are points marked unavailable, never dropped.
inline const std::vector<std::string> kGemmPrecisions = {"fp32", "tf32", "fp16", "bf16"};

// Bytes of one element of A, B and C in a precision.
double gemm_element_bytes(const std::string& precision);

void run_gemm_bench(BenchContext& context);

// ---- bandwidth --------------------------------------------------------------------------
// `scalestudy bench bandwidth`: GB/s of elementwise kernels over fp32 buffers, from 16K to
// 64M elements by default. Two kernels on each backend:
//   copy:       dst = src          8 bytes per element (read 4, write 4), no FLOPs
//               cuda: a float4 grid-stride kernel (kernels/elementwise.cu);
//               cpu: the backend's copy (memmove)
//   accumulate: dst += src         12 bytes per element (read 8, write 4), 1 FLOP
//               the backend's accumulate, as backward's residual gradients use it
// GB/s = bytes / median time / 1e9, counting bytes read plus bytes written.
inline const std::vector<std::string> kBandwidthKernels = {"copy", "accumulate"};

// Bytes read plus written per element, and FLOPs per element, of a kernel.
double bandwidth_bytes_per_elem(const std::string& kernel);
double bandwidth_flops_per_elem(const std::string& kernel);

void run_bandwidth_bench(BenchContext& context);

// ---- layer ------------------------------------------------------------------------------
// `scalestudy bench layer`: one transformer block, by default at bert-large size (hidden
// 1024, 16 heads, bidirectional), forward and forward+backward, over batches × seqs; and
// its parts on their own at one batch and seq (64 and 128 by default): the FFN's first
// dense layer, that layer with its GELU, the whole FFN, the attention sub-layer and the
// attention core.
//
// The block is timed as the code training runs: scalestudy::Gpt with one layer and with
// two, and the block's rows are the difference, sample by sample. What every model pays
// once (the embedding, the final LayerNorm, the tied LM head and the loss, and the launch
// of each pass) drops out, so the block's rate is the one a deep model's blocks reach.
// Both models' rows are kept ("model-1-layer", "model-2-layers"). The vocabulary is cut
// to kLayerVocab. FLOPs are src/model/flops.h's:
//   model forward = L·(24·b·s·h² + 4·b·s²·h) + 2·b·s·h·V, forward+backward = 3 × forward;
//   block forward = 24·b·s·h² + 4·b·s²·h (the 2-layer model's less the 1-layer's).
// The parts call the backend's ops directly; their FLOPs are in bench_model.h.
inline constexpr int kLayerVocab = 64;

// The 1-layer model of the block's timing: `shape` with layers = 1 and V = kLayerVocab.
ModelShape layer_model_shape(const ModelShape& shape);

// Bytes that the parts' buffers take on `backend` (they share one set: every activation,
// gradient and weight of a block, plus attention backward's scratch).
size_t parts_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq);

void run_layer_bench(BenchContext& context);

// ---- inference --------------------------------------------------------------------------
// `scalestudy bench inference`: forward-only latency (ms) and throughput (sequences/s)
// of a whole model, by default bert-base (12 layers, hidden 768, bidirectional, its
// 30522-token vocabulary), over batch × seq, 1..256 × 64..4096 by default. The position
// table is extended to the longest seq. A point is one Gpt::forward: embedding, every
// block, final LayerNorm, tied LM head and the softmax cross-entropy that Gpt::forward
// ends with. Points whose allocations would not fit are marked oom and kept.
void run_inference_bench(BenchContext& context);

// ---- comm -------------------------------------------------------------------------------
// `scalestudy bench comm`: allreduce, reduce-scatter and allgather through the job's
// communicator (NCCL on cuda, MPI on the cpu), for payloads from 1 KiB to 1 GiB by
// default, doubling. Reported as nccl-tests does (doc/PERFORMANCE.md in
// github.com/NVIDIA/nccl-tests), where the size of a collective is its full buffer:
//   algbw = payload bytes / time
//   busbw = algbw × factor, factor = 2(n−1)/n (allreduce), (n−1)/n (reduce-scatter,
//           allgather), n ranks
// so that busbw is comparable with the hardware's bus bandwidth whatever n is.
//
// Every point is checked: before it is timed, one collective runs on inputs whose sums
// are exact in fp32 (small integers), and every element of every rank's result is
// compared bit for bit; the wrong elements of all ranks are counted. The timed calls
// then run on zeroed buffers, whose in-place sums stay zero however often they repeat.
// A sample's time is the slowest rank's.
//
// Scopes. Each collective runs over up to three communicators, each a scope of its own
// rows (--scopes):
//   world       every rank of the job (the job's communicator);
//   intra_node  the ranks of one node, every node's at once (the node split of
//               comm/mpi_runtime.h); each node's link is its own, so the nodes do not
//               share bandwidth, and a sample is the slowest node's;
//   inter_node  one rank per node, the node's first; the others wait, so its traffic has
//               the inter-node link to itself.
// A sub-scope's communicator is the backend's (MPI on the cpu, NCCL on cuda), built over
// the scope's ranks. A scope of one rank per communicator (one node, one rank per node),
// or with nodes of unequal rank counts, is not measured: the file records it as absent,
// with the reason, and holds no rows for it.
inline const std::vector<std::string> kCommCollectives = {"allreduce", "reduce_scatter", "allgather"};
inline const std::vector<std::string> kCommScopes = {"world", "intra_node", "inter_node"};
CollectiveKind comm_collective_kind(const std::string& name);

// nccl-tests' bus-bandwidth factor of a collective over world_size ranks.
double bus_bandwidth_factor(CollectiveKind kind, int world_size);

// Elements of the payload for about `bytes` bytes of fp32: rounded down to a multiple of
// the world size (reduce-scatter and allgather split it evenly), at least one per rank.
size_t comm_payload_elems(int64_t bytes, int world_size);

// The exact inputs: element i of rank r's send buffer is (r + 1)·(1 + i mod 251). Every
// partial sum is an integer below 2^24, so exact in fp32 in any order, up to 364 ranks.
float comm_input(int rank, size_t index);
// Elements of `result` (this rank's receive buffer) that differ from the exact answer;
// payload_elems is the full buffer the collective covers.
size_t count_wrong_elems(CollectiveKind kind, int rank, int world_size, size_t payload_elems,
                         const std::vector<float>& result);

void run_comm_bench(BenchContext& context);

}  // namespace scalestudy
