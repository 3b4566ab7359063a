#include "core/model_shape.h"

#include "core/usage_error.h"

namespace scalestudy {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"tiny", {2, 32, 4, 64, 64, true}, "2 layers, 32 channels: for tests and the quickstart"},
      {"gpt2-small", {12, 768, 12, 50257, 1024, true}, "GPT-2 124M"},
      {"gpt2-medium", {24, 1024, 16, 50257, 1024, true}, "GPT-2 350M"},
      {"gpt2-large", {36, 1280, 20, 50257, 1024, true}, "GPT-2 774M"},
      {"gpt2-xl", {48, 1600, 25, 50257, 1024, true}, "GPT-2 1558M"},
      {"bert-base", {12, 768, 12, 30522, 512, false}, "BERT-base sizes, bidirectional"},
      {"bert-large", {24, 1024, 16, 30522, 512, false}, "BERT-large sizes, bidirectional"},
  };
  return presets;
}

const ModelPreset& find_model_preset(const std::string& name) {
  for (const auto& preset : model_presets()) {
    if (preset.name == name) return preset;
  }
  std::string known;
  for (const auto& preset : model_presets()) known += (known.empty() ? "" : ", ") + preset.name;
  throw UsageError("--model " + name + ": unknown model (known: " + known + ")");
}

}  // namespace scalestudy
