#pragma once
#include <string>
#include <vector>

namespace scalestudy {

// The dimensions of a GPT-style transformer.
struct ModelShape {
  int layers = 0;     // L
  int channels = 0;   // C (hidden size)
  int heads = 0;      // NH; must divide C
  int vocab = 0;      // V
  int max_seq = 0;    // rows of the position table
  bool causal = true; // false: bidirectional attention (BERT-style)
  int head_size() const { return channels / heads; }
};

// Named presets. GPT-2 sizes follow the published GPT-2 family (Radford et al., 2019);
// BERT sizes follow Devlin et al. (2018), run here as a bidirectional GPT-style stack.
struct ModelPreset {
  std::string name;
  ModelShape shape;
  std::string summary;
};
const std::vector<ModelPreset>& model_presets();
// Throws UsageError naming --model when the name is unknown.
const ModelPreset& find_model_preset(const std::string& name);

}  // namespace scalestudy
