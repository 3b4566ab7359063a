#include "config/option_groups.h"

#include <optional>
#include <tuple>

#include "config/command_options.h"
#include "core/usage_error.h"

namespace po = boost::program_options;

namespace scalestudy {
namespace {

constexpr const char* kAttentionKernelHelp =
    "cuda: the fused attention's kernels, flash (the project's own) or, in bf16, cudnn (cuDNN 9's SDPA, "
    "opened at run time); auto: cudnn in bf16 where libcudnn 9 loads, else flash";

constexpr const char* kLinkEmulationHelp =
    "cuda, one host: none (NCCL's own links) or socket (NCCL's network transport over TCP on the "
    "loopback, as if each GPU were on a node of its own; docs/strategies.md)";

}  // namespace

void add_model_shape_options(po::options_description& section, ModelShapeOptions& o, const std::string& model_default) {
  section.add_options()
      ("model", po::value(&o.model)->default_value(o.model, model_default),
       "preset (see scalestudy info): tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, bert-base or "
       "bert-large; the options below override its shape")
      ("layers", po::value(&o.layers)->default_value(0, "preset"), "transformer blocks (L); bench layer measures one")
      ("hidden", po::value(&o.hidden)->default_value(0, "preset"), "channels (C)")
      ("heads", po::value(&o.heads)->default_value(0, "preset"), "attention heads; must divide --hidden");
}

ModelShape resolve_model_shape(const ModelShapeOptions& o, const po::variables_map& values) {
  ModelShape shape = find_model_preset(o.model).shape;
  for (auto [option, value, field] : {std::tuple{"layers", o.layers, &shape.layers},
                                      {"hidden", o.hidden, &shape.channels}, {"heads", o.heads, &shape.heads}}) {
    // 0 is what each means when left out; given, it would be taken silently for that.
    if (given(values, option) && value == 0) bad_value(option, "0", "must be at least 1 (leave it out for the preset's)");
    if (value < 0) bad_value(option, std::to_string(value), "must be positive");
    if (value > 0) *field = value;
  }
  if (shape.channels % shape.heads != 0)
    bad_value("heads", std::to_string(shape.heads), "must divide --hidden " + std::to_string(shape.channels));
  return shape;
}

void add_vocab_option(po::options_description& section, int* vocab) {
  section.add_options()("vocab", po::value(vocab)->default_value(0, "preset"),
                        "vocabulary size (V), the LM head's rows; train: at least the data's");
}

void apply_vocab(ModelShape& shape, int vocab) {
  if (vocab < 0) bad_value("vocab", std::to_string(vocab), "must be positive");
  if (vocab > 0) shape.vocab = vocab;
}

void add_seq_option(po::options_description& section, int* seq) {
  section.add_options()("seq", po::value(seq)->default_value(0, "max-seq"),
                        "tokens per sample (T); at most the position table's rows (--max-seq, or the preset's)");
}

void add_gemm_algos_file_option(po::options_description& section, std::string* path) {
  section.add_options()
      ("gemm-algos-file", po::value(path),
       "cuda 16-bit: GEMM algorithms for this GPU model and cuBLASLt, chosen under sustained load by "
       "scalestudy gemm-search, which makes and adds to the file; train takes them for their shapes");
}

void add_backend_options(po::options_description& section, BackendOptions& o) {
  section.add_options()
      ("backend", defaulted(&o.backend),
       "cpu (the fp32 reference, MPI) or cuda (cuBLAS and the project's kernels, NCCL); bench's sizes follow it")
      ("precision", defaulted(&o.precision),
       "fp32, bf16 or fp16 (the last two cuda only); auto: bf16 on cuda, fp32 on cpu")
      ("attention-kernel", defaulted(&o.attention_kernel), kAttentionKernelHelp);
}

void check_backend(const std::string& backend) {
  if (backend != "cpu" && backend != "cuda") bad_value("backend", backend, "must be cpu or cuda");
  if (backend == "cuda" && !SCALESTUDY_HAVE_CUDA) bad_value("backend", backend, "this build has no CUDA backend");
}

Precision resolve_precision(const std::string& precision, const std::string& backend) {
  const bool cuda = backend == "cuda";
  if (precision == "auto") return cuda ? Precision::bf16 : Precision::fp32;
  for (Precision named : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    if (precision != precision_name(named)) continue;
    if (!cuda && named != Precision::fp32) bad_value("precision", precision, "the cpu backend computes in fp32 only");
    return named;
  }
  bad_value("precision", precision, "must be auto, fp32, bf16 or fp16");
}

AttentionKernel parse_attention_kernel(const std::string& text, const std::string& backend, Precision precision) {
  const std::optional<AttentionKernel> kernel = kAttentionKernelNames.find(text);
  if (!kernel) bad_value("attention-kernel", text, "must be auto, flash or cudnn");
  if (*kernel == AttentionKernel::cudnn && backend != "cuda")
    bad_value("attention-kernel", text, "needs --backend cuda (the " + backend + " backend has no cuDNN)");
  // fp16 keeps the flash kernels: cuDNN's fp16 backward rounds gradients in fp16's
  // subnormal range up to two steps from the nearest value, beyond the bound that the
  // attention tests hold every kernel to (tests/gpu/test_gpu_attention_ops.cpp).
  if (*kernel == AttentionKernel::cudnn && precision != Precision::bf16)
    bad_value("attention-kernel", text, std::string("needs --precision bf16 (") + precision_name(precision) +
                                            (is_16bit(precision) ? " keeps the flash kernels)" : " keeps the probabilities in memory)"));
  return *kernel;
}

void add_output_options(po::options_description& section, OutputOptions& o) {
  section.add_options()
      ("output,o", po::value(&o.output),
       "HDF5 result file to write (docs/results-schema.md). Default: none, the results are only printed")
      ("overwrite", po::bool_switch(&o.overwrite),
       "replace a file that exists at --output (never one another run is writing); without it such a "
       "file is refused. Default: off");
}

void check_output_options(const OutputOptions& o, const po::variables_map& values,
                          const std::vector<std::pair<std::string, std::string>>& inputs, bool create_folder) {
  if (given(values, "output") && o.output.empty())
    bad_value("output", "''", "is empty: name a file, or leave --output out to write none");
  if (o.output.empty()) return;
  check_output_path({.output = o.output, .overwrite = o.overwrite, .inputs = inputs, .create_folder = create_folder});
}

void add_comm_options(po::options_description& section, CommOptions& o) {
  section.add_options()
      ("comm-timeout", defaulted(&o.comm_timeout_s),
       (std::string("seconds a collective or the start-up may take before the job ends, naming rank and "
                    "phase; other ranks wait 1 s more, so rank 0 marks the file failed first; ") +
        kCommTimeoutBounds)
           .c_str())
      ("link-emulation", defaulted(&o.link_emulation), kLinkEmulationHelp);
}

void check_comm_options(const CommOptions& o, const std::string& backend) {
  check_comm_timeout(o.comm_timeout_s);
  if (o.link_emulation != "none" && o.link_emulation != "socket")
    bad_value("link-emulation", o.link_emulation, "must be none or socket");
  if (o.link_emulation != "none" && backend != "cuda")
    bad_value("link-emulation", o.link_emulation,
              "needs --backend cuda (the cpu backend communicates through MPI, whose links this option does not set)");
}

void add_help_option(po::options_description& section) {
  section.add_options()("help,h", "print this help and exit");
}

void add_profile_kernels_option(po::options_description& section, bool* profile_kernels) {
  section.add_options()
      ("profile-kernels", po::bool_switch(profile_kernels),
       "cuda: trace kernels, memcpys and memsets with CUPTI into the file's /kernel_trace: train's "
       "--profile-window steps (out of the summaries), bench's one untimed sample per point. Default: off");
}

void check_profile_kernels(bool profile_kernels, const std::string& backend) {
  if (profile_kernels && backend != "cuda")
    throw UsageError("--profile-kernels: needs --backend cuda (the " + backend + " backend runs no GPU kernels to trace)");
}

}  // namespace scalestudy
