#include <cstdio>
#include <string>

#include "build_info.h"
#include "cli/commands.h"
#include "core/precision.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "model/parameter_layout.h"

namespace scalestudy {
namespace {

const char* kInfoHelp =
    "Usage: scalestudy info [--json]\n"
    "Prints the model presets, their parameter counts and training FLOPs per token at the preset's\n"
    "sequence length.\n"
    "  --json   print instead what this build can run, as one JSON object: version, git_sha, backends\n"
    "           (cpu, and cuda where built) with the precisions of each, and the presets with their\n"
    "           shapes, parameters and train_flops_per_token (at the preset's max_seq)\n";

// Training FLOPs per token of one sequence of the preset's full length.
double train_flops_per_token(const ModelShape& s) { return training_flops(s, 1, s.max_seq) / s.max_seq; }

void print_table() {
  // Four significant digits, not three decimals: tiny trains at 0.0002 GFLOP a token,
  // gpt2-xl at 10, and %g writes both without an exponent.
  std::printf("%-12s %6s %6s %6s %7s %6s %-13s %15s %18s\n", "model", "layers", "hidden", "heads",
              "vocab", "seq", "attention", "parameters", "train GFLOP/token");
  for (const ModelPreset& preset : model_presets()) {
    const ModelShape& s = preset.shape;
    const ParameterLayout layout = make_parameter_layout(s);
    std::printf("%-12s %6d %6d %6d %7d %6d %-13s %15zu %18.4g\n", preset.name.c_str(), s.layers, s.channels,
                s.heads, s.vocab, s.max_seq, s.causal ? "causal" : "bidirectional", layout.param_elems,
                train_flops_per_token(s) / 1e9);
  }
}

// The names printed are the project's own (presets, backends, precisions): none needs
// escaping in a JSON string.
void print_json() {
  std::printf("{\"version\": \"%s\", \"git_sha\": \"%s\",\n", SCALESTUDY_VERSION, SCALESTUDY_GIT_SHA);
  std::printf(" \"backends\": {\"cpu\": {\"precisions\": [\"fp32\"]}");
  if (SCALESTUDY_HAVE_CUDA) std::printf(", \"cuda\": {\"precisions\": [\"fp32\", \"bf16\", \"fp16\"]}");
  std::printf("},\n \"presets\": [");
  const char* separator = "\n";
  for (const ModelPreset& preset : model_presets()) {
    const ModelShape& s = preset.shape;
    std::printf("%s  {\"name\": \"%s\", \"layers\": %d, \"hidden\": %d, \"heads\": %d, \"vocab\": %d, "
                "\"max_seq\": %d, \"attention\": \"%s\", \"parameters\": %zu, \"train_flops_per_token\": %.17g}",
                separator, preset.name.c_str(), s.layers, s.channels, s.heads, s.vocab, s.max_seq,
                s.causal ? "causal" : "bidirectional", make_parameter_layout(s).param_elems,
                train_flops_per_token(s));
    separator = ",\n";
  }
  std::printf("\n ]}\n");
}

}  // namespace

int run_info_command(int argc, const char* const* argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kInfoHelp);
      return 0;
    }
    if (arg != "--json") throw UsageError("unrecognised option '" + arg + "'");
    json = true;
  }
  if (json) print_json();
  else print_table();
  return 0;
}

}  // namespace scalestudy
