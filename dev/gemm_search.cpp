// gemm_search: a file of GEMM algorithms for --gemm-algos-file, chosen under sustained load
// (sustained_search.h) for every GEMM that one training step of a model runs on this GPU.
//
//   gemm_search --model gpt2-small --batch 64 [--seq 1024] [--precision bf16] [--reserve 4]
//               --output FILE
//
// --batch is the micro-batch a rank runs (its batch divided into its micro-batches);
// --reserve N also chooses for the GEMMs sized for the multiprocessors that an overlapped
// lane of N leaves (--overlap on, --overlapped-ctas N). The choices hold for the GPU model and
// cuBLASLt that made them. Choices already in FILE are kept, and each is written as it is
// made: one FILE can take every micro-batch of a sweep, run after run, and an interrupted
// search resumes. The step's results are not used: the search runs each GEMM many times on
// its own operands, and those that add to their output add to it again.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "bench/bench_gpt.h"
#include "core/model_shape.h"
#include "model/gpt.h"
#include "model/parameter_layout.h"
#include "sustained_search.h"

namespace scalestudy {
namespace {

struct SearchOptions {
  std::string model, output, precision = "bf16";
  int batch = 0, seq = 0, reserve = 0;
};

SearchOptions parse(int argc, char** argv) {
  std::map<std::string, std::string> values;
  for (int index = 1; index + 1 < argc; index += 2) values[argv[index]] = argv[index + 1];
  if (argc % 2 == 0) throw std::invalid_argument(std::string("a value is missing after ") + argv[argc - 1]);
  const auto take = [&](const std::string& name, const std::string& fallback) {
    const auto found = values.find(name);
    const std::string value = found != values.end() ? found->second : fallback;
    if (found != values.end()) values.erase(found);
    if (value.empty()) throw std::invalid_argument(name + " is required");
    return value;
  };
  const auto number = [&](const std::string& name, const std::string& fallback) {
    const std::string text = take(name, fallback);
    size_t used = 0;
    try {
      const int value = std::stoi(text, &used);
      if (used == text.size()) return value;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument(name + " " + text + ": not a whole number");
  };
  SearchOptions options;
  options.model = take("--model", "");
  options.output = take("--output", "");
  options.precision = take("--precision", "bf16");
  options.batch = number("--batch", "");
  options.seq = number("--seq", "0");
  options.reserve = number("--reserve", "0");
  if (!values.empty()) throw std::invalid_argument("unknown option " + values.begin()->first);
  if (options.precision != "bf16" && options.precision != "fp16")
    throw std::invalid_argument("--precision must be bf16 or fp16");
  if (options.batch <= 0 || options.seq < 0 || options.reserve < 0)
    throw std::invalid_argument("--batch must be positive, --seq and --reserve not negative");
  return options;
}

// One forward and backward, as a training step runs them, with every GEMM's algorithm
// chosen at its first call.
void run_step(CudaOps& ops, Gpt& model, const ModelShape& shape, int tokens) {
  const std::vector<int32_t> inputs = random_tokens(size_t(tokens), shape.vocab, 1);
  const std::vector<int32_t> targets = random_tokens(size_t(tokens), shape.vocab, 2);
  FlatGradients sink(ops, model);
  const float loss_scale = 1.0f / static_cast<float>(tokens);
  model.forward(inputs.data(), targets.data(), nullptr, loss_scale);
  model.backward(sink, loss_scale);
  ops.synchronize();
}

int search(const SearchOptions& options) {
  const ModelShape shape = find_model_preset(options.model).shape;
  const int seq = options.seq > 0 ? options.seq : shape.max_seq;
  const Precision precision = options.precision == "fp16" ? Precision::fp16 : Precision::bf16;
  const std::string machine = cuda::gemm_machine(0);
  cuda::GemmChoiceFile file;
  if (std::FILE* existing = std::fopen(options.output.c_str(), "r")) {
    std::fclose(existing);
    file = cuda::GemmChoiceFile::read(options.output, machine);
    if (!file.set_aside_because().empty()) throw std::invalid_argument(file.set_aside_because());
  }
  auto chooser = std::make_shared<gemm_search::SustainedChooser>(file, options.output, machine);
  CudaOps ops(0, precision, GemmAlgos::heuristic, AttentionKernel::flash, chooser);
  const ParameterLayout layout = make_parameter_layout(shape);
  Gpt model(ops, shape, options.batch, seq, layout.param_elems);
  ParameterCache(1).initialize(ops, model);
  for (int reserve : {0, options.reserve}) {
    ops.reserve_multiprocessors(reserve);
    run_step(ops, model, shape, options.batch * seq);
    if (options.reserve == 0) break;
  }
  std::cout << file.size() << " GEMM algorithms in " << options.output << " for " << machine << std::endl;
  return 0;
}

}  // namespace
}  // namespace scalestudy

int main(int argc, char** argv) {
  try {
    return scalestudy::search(scalestudy::parse(argc, argv));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gemm_search: %s\n", error.what());
    return 2;
  }
}
