#pragma once
// The option groups that `train`, `bench` and `gemm-search` share, each declared once here:
// model shape, the vocabulary, the sequence and the GEMM choice file, backend and
// precision, output, communication, and the help and kernel-profile switches.
// A command adds a group to one of its --help sections and checks the group's values with
// the group's own check, so the name, the default, the help text and the error of a shared
// option are the same in every command.
#include <boost/program_options.hpp>

#include <string>
#include <utility>
#include <vector>

#include "config/output_path.h"
#include "core/model_shape.h"
#include "core/precision.h"

namespace scalestudy {

// ---- model shape: --model and the overrides of its shape --------------------------------
struct ModelShapeOptions {
  std::string model;                    // preset; the command's default
  int layers = 0, hidden = 0, heads = 0;  // 0: the preset's
};
// model_default: how --help shows --model's default ("tiny", or "by backend" with the
// presets each benchmark takes).
void add_model_shape_options(boost::program_options::options_description& section, ModelShapeOptions& options,
                             const std::string& model_default);
// The preset's shape with the given overrides; refuses, naming the option, a given 0, a
// negative size or heads that do not divide the hidden size.
ModelShape resolve_model_shape(const ModelShapeOptions& options, const boost::program_options::variables_map& values);

// ---- the step's vocabulary, sequence and GEMM algorithms: train and gemm-search -------
// --vocab: the LM head's rows, and so its GEMMs' shapes; left out (0), the preset's.
void add_vocab_option(boost::program_options::options_description& section, int* vocab);
// The shape with a given --vocab; refuses a negative one, naming the option.
void apply_vocab(ModelShape& shape, int vocab);
// --seq, tokens per sample; left out (0), the position table's rows.
void add_seq_option(boost::program_options::options_description& section, int* seq);
// --gemm-algos-file: the choice file that gemm-search makes and extends and train reads.
void add_gemm_algos_file_option(boost::program_options::options_description& section, std::string* path);

// ---- backend and precision ------------------------------------------------------------
struct BackendOptions {
  std::string backend = "cpu";
  std::string precision = "auto";
  std::string attention_kernel = "auto";
};
void add_backend_options(boost::program_options::options_description& section, BackendOptions& options);
// --backend: cpu, or cuda where this build has it.
void check_backend(const std::string& backend);
// --precision on a checked backend: auto is bf16 on cuda and fp32 on the cpu, which
// computes in fp32 only.
Precision resolve_precision(const std::string& precision, const std::string& backend);
// --attention-kernel's value for `backend` in `precision`: auto, flash or cudnn, where
// cudnn needs cuda in bf16. Throws UsageError naming the option and the value. Whether
// libcudnn loads is checked where the backend is made.
AttentionKernel parse_attention_kernel(const std::string& text, const std::string& backend, Precision precision);

// ---- output -----------------------------------------------------------------------------
struct OutputOptions {
  std::string output;  // empty: none
  bool overwrite = false;
};
void add_output_options(boost::program_options::options_description& section, OutputOptions& options);
// Refuses a given empty --output, then checks the path (config/output_path.h): none of
// `inputs` (option, path), and its folder made unless create_folder is false.
void check_output_options(const OutputOptions& options, const boost::program_options::variables_map& values,
                          const std::vector<std::pair<std::string, std::string>>& inputs, bool create_folder);

// ---- communication ----------------------------------------------------------------------
struct CommOptions {
  double comm_timeout_s = 300.0;
  std::string link_emulation = "none";
};
void add_comm_options(boost::program_options::options_description& section, CommOptions& options);
// --comm-timeout's bounds, and --link-emulation none, or socket on cuda.
void check_comm_options(const CommOptions& options, const std::string& backend);

// ---- help and kernel profile ---------------------------------------------------------
void add_help_option(boost::program_options::options_description& section);
void add_profile_kernels_option(boost::program_options::options_description& section, bool* profile_kernels);
// --profile-kernels needs cuda.
void check_profile_kernels(bool profile_kernels, const std::string& backend);

}  // namespace scalestudy
