#include "backend/cuda/cudnn_attention.h"

#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/dynamic_symbol.h"
#include "core/check.h"

#if SCALESTUDY_HAVE_CUDNN
#include <cudnn_frontend.h>

// The library handle that the frontend's dynamic loading resolves every cuDNN entry point
// through (its headers declare it and leave the definition to the program).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace scalestudy {

bool cudnn_attention_supported(const AttentionShape& shape) {
  const int head_size = attention_head_size(shape);
  // cuDNN refuses one query against one key (its graph validation: "s_q = s_kv = 1 is not
  // supported").
  return head_size % 8 == 0 && head_size <= 128 && shape.seq > 1;
}

#if SCALESTUDY_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

// cuDNN 9 is the first whose SDPA takes bf16 and fp16 forward and backward with a causal
// mask at any sequence length on Hopper, and whose errors carry a message
// (cudnnGetLastErrorString).
constexpr size_t kMinimumCudnnVersion = 90000;

// The reason libcudnn cannot be used, or empty once it is open and recent enough.
std::string open_cudnn() {
  // The frontend reaches the CUDA runtime through dlopen of a libcudart soname: naming the
  // one this executable links makes that the runtime already loaded, never a second one of
  // another major version. A user's own setting wins.
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
  std::string failures;
  void* library = nullptr;
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    const char* error = dlerror();
    failures += std::string(failures.empty() ? "" : "; ") + (error != nullptr ? error : name);
  }
  if (library == nullptr)
    return "libcudnn cannot be opened (" + failures + "); put cuDNN 9's lib folder on LD_LIBRARY_PATH";
  size_t (*get_version)() = nullptr;
  if (!load_symbol(library, "cudnnGetVersion", get_version)) return "the libcudnn opened has no cudnnGetVersion";
  const size_t version = get_version();
  if (version < kMinimumCudnnVersion)
    return "libcudnn is version " + std::to_string(version) + "; the fused attention needs cuDNN 9.0 or later";
  fe::cudnn_dlhandle = library;
  return "";
}

// Opened once per process: later calls repeat the first answer.
const std::string& cudnn_load_error() {
  static const std::string error = open_cudnn();
  return error;
}

std::string describe_cudnn_status(cudnnStatus_t status) {
  return std::string(fe::detail::get_error_string(status)) + ": " + fe::detail::get_last_error_string_();
}

std::string describe_frontend_error(const fe::error_t& error) {
  return "cudnn-frontend error " + std::to_string(static_cast<int>(error.code)) + ": " + error.err_msg;
}

}  // namespace
}  // namespace scalestudy

// cuDNN's status codes, and the frontend's error objects, each with the library's message.
#define CHECK_CUDNN(call) SCALESTUDY_CHECK_RESULT(call, CUDNN_STATUS_SUCCESS, ::scalestudy::describe_cudnn_status)
#define CHECK_CUDNN_FE(call)                                                                       \
  do {                                                                                             \
    const fe::error_t frontend_result_ = (call);                                                   \
    if (frontend_result_.is_bad())                                                                 \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, describe_frontend_error(frontend_result_)); \
  } while (0)

namespace scalestudy {
namespace {

// The tensors' ids in a graph's variant pack.
enum TensorUid : int64_t { q_uid = 1, k_uid, v_uid, out_uid, lse_uid, dout_uid, dq_uid, dk_uid, dv_uid };

// Dims and strides in cuDNN's SDPA order (batch, heads, sequence, head dim) over the op
// interface's row-major layouts.
struct SdpaLayout {
  int64_t batch, heads, seq, head_size, channels, out_row;
  explicit SdpaLayout(const AttentionShape& shape)
      : batch(shape.batch), heads(shape.heads), seq(shape.seq), head_size(attention_head_size(shape)),
        channels(shape.channels), out_row(row_stride(shape.out_stride, shape.channels)) {}
  std::vector<int64_t> dims() const { return {batch, heads, seq, head_size}; }
  // Q, K and V (and their gradients) inside qkv[B,T,3C]: a token's row is 3C long.
  std::vector<int64_t> qkv_strides() const { return {seq * 3 * channels, head_size, 3 * channels, 1}; }
  // out [B,T,C], its rows out_row apart (plain or augmented), and dout [B,T,C].
  std::vector<int64_t> out_strides() const { return {seq * out_row, head_size, out_row, 1}; }
  std::vector<int64_t> dout_strides() const { return {seq * channels, head_size, channels, 1}; }
  // lse [B,NH,T]: one fp32 per query row.
  std::vector<int64_t> lse_dims() const { return {batch, heads, seq, 1}; }
  std::vector<int64_t> lse_strides() const { return {heads * seq, seq, 1, 1}; }
};

struct GraphKey {
  int batch, seq, heads, head_size;
  bool causal;
  int out_stride;
  Precision precision;
  auto operator<=>(const GraphKey&) const = default;
};

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

fe::DataType_t io_type(Precision precision) {
  SCALESTUDY_CHECK(is_16bit(precision), std::string("cuDNN's fused attention runs in bf16 or fp16, not ") +
                                            precision_name(precision));
  return precision == Precision::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::shared_ptr<fe::graph::Graph> new_graph(Precision precision) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type(precision))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& graph, const char* name, TensorUid uid,
                                                    const std::vector<int64_t>& dims,
                                                    const std::vector<int64_t>& strides) {
  return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

void mark_output(fe::graph::Tensor_attributes& tensor, TensorUid uid, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& strides) {
  tensor.set_output(true).set_uid(uid).set_dim(dims).set_stride(strides);
}

float softmax_scale(const AttentionShape& shape) {
  return 1.0f / std::sqrt(static_cast<float>(attention_head_size(shape)));
}

// Validates the graph, lowers it, plans it from cuDNN's heuristics (its fallback list
// after them), checks that an engine takes it, and builds the plan; returns its workspace.
int64_t plan_graph(fe::graph::Graph& graph, cudnnHandle_t handle) {
  CHECK_CUDNN_FE(graph.validate());
  CHECK_CUDNN_FE(graph.build_operation_graph(handle));
  CHECK_CUDNN_FE(graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  CHECK_CUDNN_FE(graph.check_support(handle));
  CHECK_CUDNN_FE(graph.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
  int64_t workspace_bytes = -1;
  CHECK_CUDNN_FE(graph.get_workspace_size(workspace_bytes));
  SCALESTUDY_CHECK(workspace_bytes >= 0, "cuDNN's attention plan reports a workspace of " +
                                             std::to_string(workspace_bytes) + " bytes");
  return workspace_bytes;
}

// Q, K and V, read in place from qkv.
std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 3> qkv_inputs(fe::graph::Graph& graph,
                                                                         const SdpaLayout& layout) {
  return {input(graph, "q", q_uid, layout.dims(), layout.qkv_strides()),
          input(graph, "k", k_uid, layout.dims(), layout.qkv_strides()),
          input(graph, "v", v_uid, layout.dims(), layout.qkv_strides())};
}

BuiltGraph build_forward(const AttentionShape& shape, Precision precision, cudnnHandle_t handle) {
  const SdpaLayout layout(shape);
  auto graph = new_graph(precision);
  auto [q, k, v] = qkv_inputs(*graph, layout);
  const auto options = fe::graph::SDPA_attributes()
                           .set_name("attention_forward")
                           .set_generate_stats(true)
                           .set_causal_mask(shape.causal)
                           .set_attn_scale(softmax_scale(shape));
  auto [out, lse] = graph->sdpa(q, k, v, options);
  mark_output(*out, out_uid, layout.dims(), layout.out_strides());
  mark_output(*lse, lse_uid, layout.lse_dims(), layout.lse_strides());
  lse->set_data_type(fe::DataType_t::FLOAT);
  const int64_t workspace_bytes = plan_graph(*graph, handle);
  return {graph, workspace_bytes};
}

BuiltGraph build_backward(const AttentionShape& shape, Precision precision, cudnnHandle_t handle) {
  const SdpaLayout layout(shape);
  auto graph = new_graph(precision);
  auto [q, k, v] = qkv_inputs(*graph, layout);
  auto out = input(*graph, "out", out_uid, layout.dims(), layout.out_strides());
  auto dout = input(*graph, "dout", dout_uid, layout.dims(), layout.dout_strides());
  auto lse = input(*graph, "lse", lse_uid, layout.lse_dims(), layout.lse_strides());
  lse->set_data_type(fe::DataType_t::FLOAT);
  const auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_causal_mask(shape.causal)
                           .set_attn_scale(softmax_scale(shape));
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, out, dout, lse, options);
  mark_output(*dq, dq_uid, layout.dims(), layout.qkv_strides());
  mark_output(*dk, dk_uid, layout.dims(), layout.qkv_strides());
  mark_output(*dv, dv_uid, layout.dims(), layout.qkv_strides());
  const int64_t workspace_bytes = plan_graph(*graph, handle);
  return {graph, workspace_bytes};
}

using VariantPack = std::unordered_map<int64_t, void*>;

// Q, K and V (or their gradients) of a packed qkv[B,T,3C] of 16-bit elements, the thirds of
// each token's row, into the pack under `uids`.
void pack_thirds(VariantPack& pack, const void* qkv, const AttentionShape& shape, std::array<TensorUid, 3> uids) {
  constexpr size_t kHalfBytes = 2;
  for (size_t third = 0; third < uids.size(); ++third)
    pack[uids[third]] = const_cast<char*>(static_cast<const char*>(qkv)) + third * shape.channels * kHalfBytes;
}

}  // namespace

struct CudnnAttention::Graphs {
  Precision precision = Precision::bf16;
  cudnnHandle_t handle = nullptr;
  std::map<GraphKey, BuiltGraph> forward, backward;

  GraphKey key(const AttentionShape& shape) const {
    SCALESTUDY_CHECK(cudnn_attention_supported(shape),
                     "cuDNN's fused attention takes head sizes that are multiples of 8 up to 128 and more "
                     "than one token, not head size " + std::to_string(attention_head_size(shape)) + " at seq " +
                         std::to_string(shape.seq));
    return {shape.batch, shape.seq, shape.heads, attention_head_size(shape), shape.causal, shape.out_stride,
            precision};
  }
  // The pass's graph for `shape`, built by `build` the first time the shape comes.
  template <class Build>
  const BuiltGraph& graph_for(std::map<GraphKey, BuiltGraph>& built, const AttentionShape& shape, Build build) {
    const GraphKey k = key(shape);
    auto found = built.find(k);
    if (found == built.end()) found = built.emplace(k, build(shape, precision, handle)).first;
    return found->second;
  }
  const BuiltGraph& forward_graph(const AttentionShape& shape) { return graph_for(forward, shape, build_forward); }
  const BuiltGraph& backward_graph(const AttentionShape& shape) { return graph_for(backward, shape, build_backward); }
};

bool cudnn_attention_loadable(std::string& why_not) {
  why_not = cudnn_load_error();
  return why_not.empty();
}

CudnnAttention::CudnnAttention(Precision precision, cudaStream_t stream) : graphs_(std::make_unique<Graphs>()) {
  std::string why_not;
  SCALESTUDY_CHECK(cudnn_attention_loadable(why_not), "cuDNN's fused attention: " + why_not);
  graphs_->precision = precision;
  (void)io_type(precision);
  CHECK_CUDNN(fe::detail::create_handle(&graphs_->handle));
  CHECK_CUDNN(fe::detail::set_stream(graphs_->handle, stream));
}

CudnnAttention::~CudnnAttention() {
  // The graphs hold plans of the handle: they go first.
  graphs_->forward.clear();
  graphs_->backward.clear();
  if (graphs_->handle != nullptr) CHECK_CUDNN(fe::detail::destroy_handle(graphs_->handle));
}

size_t CudnnAttention::forward_workspace_bytes(const AttentionShape& shape) {
  return static_cast<size_t>(graphs_->forward_graph(shape).workspace_bytes);
}

size_t CudnnAttention::backward_workspace_bytes(const AttentionShape& shape) {
  return static_cast<size_t>(graphs_->backward_graph(shape).workspace_bytes);
}

void CudnnAttention::forward(const CudnnAttentionForward& args, void* workspace) {
  const BuiltGraph& built = graphs_->forward_graph(args.shape);
  SCALESTUDY_CHECK(workspace != nullptr || built.workspace_bytes == 0, "cuDNN's attention forward needs a workspace");
  VariantPack tensors = {{out_uid, args.out}, {lse_uid, args.lse}};
  pack_thirds(tensors, args.qkv, args.shape, {q_uid, k_uid, v_uid});
  CHECK_CUDNN_FE(built.graph->execute(graphs_->handle, tensors, workspace));
}

void CudnnAttention::backward(const CudnnAttentionBackward& args, void* workspace) {
  const BuiltGraph& built = graphs_->backward_graph(args.shape);
  SCALESTUDY_CHECK(workspace != nullptr || built.workspace_bytes == 0, "cuDNN's attention backward needs a workspace");
  VariantPack tensors = {{out_uid, const_cast<void*>(args.out)},
                         {dout_uid, const_cast<void*>(args.dout)},
                         {lse_uid, const_cast<float*>(args.lse)}};
  pack_thirds(tensors, args.qkv, args.shape, {q_uid, k_uid, v_uid});
  pack_thirds(tensors, args.dqkv, args.shape, {dq_uid, dk_uid, dv_uid});
  CHECK_CUDNN_FE(built.graph->execute(graphs_->handle, tensors, workspace));
}

#else  // a build without cudnn-frontend's or cuDNN's headers

struct CudnnAttention::Graphs {};

bool cudnn_attention_loadable(std::string& why_not) {
  why_not = "this build has no cuDNN attention (cudnn-frontend's or cuDNN's headers were not found when it was "
            "configured; see CUDNN_FRONTEND_INCLUDE_DIR)";
  return false;
}

CudnnAttention::CudnnAttention(Precision, cudaStream_t) {
  std::string why_not;
  cudnn_attention_loadable(why_not);
  SCALESTUDY_CHECK(false, why_not);
}

CudnnAttention::~CudnnAttention() = default;
size_t CudnnAttention::forward_workspace_bytes(const AttentionShape&) { return 0; }
size_t CudnnAttention::backward_workspace_bytes(const AttentionShape&) { return 0; }
void CudnnAttention::forward(const CudnnAttentionForward&, void*) {}
void CudnnAttention::backward(const CudnnAttentionBackward&, void*) {}

#endif

}  // namespace scalestudy
