#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "model/parameter_layout.h"

namespace scalestudy {

int run_info_command(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("Usage: scalestudy info\nPrints the model presets, their parameter counts and "
                  "training FLOPs per token at the preset's sequence length.\n");
      return 0;
    }
    throw UsageError("unrecognised option '" + arg + "'");
  }
  std::printf("%-12s %6s %6s %6s %7s %6s %-13s %15s %18s\n", "model", "layers", "hidden", "heads",
              "vocab", "seq", "attention", "parameters", "train GFLOP/token");
  for (const ModelPreset& preset : model_presets()) {
    const ModelShape& s = preset.shape;
    const ParameterLayout layout = make_parameter_layout(s);
    std::printf("%-12s %6d %6d %6d %7d %6d %-13s %15zu %18.3f\n", preset.name.c_str(), s.layers, s.channels,
                s.heads, s.vocab, s.max_seq, s.causal ? "causal" : "bidirectional", layout.param_elems,
                training_flops(s, 1, s.max_seq) / s.max_seq / 1e9);
  }
  return 0;
}

}  // namespace scalestudy
