// `scalestudy gemm-search`: the file of GEMM algorithms that `train --gemm-algos-file`
// reads, each chosen under sustained load (kernels/gemm_search.cuh) for a GEMM that one
// training step of the model runs at one micro-batch on this GPU. One process, one GPU; no
// MPI. Choices already in the file are kept and each is written as it is made, so one file
// takes every micro-batch of a sweep, search after search, and a stopped search resumes.
#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "config/command_options.h"
#include "config/option_groups.h"
#include "core/usage_error.h"
#include "results/output_lock.h"

#if SCALESTUDY_HAVE_CUDA
#include <memory>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "bench/bench_gpt.h"
#include "cli/backend_setup.h"
#include "gemm_search.cuh"
#include "model/gpt.h"
#include "model/parameter_layout.h"
#endif

namespace po = boost::program_options;

namespace scalestudy {
namespace {

struct RawOptions {
  ModelShapeOptions shape{"gpt2-small"};
  BackendOptions backend{"cuda"};
  int vocab = 0, micro_batch = 0, seq = 0, reserve = 0;
  double cool_down_s = 60.0;
  std::string choices_path;
};

struct GemmSearchConfig {
  ModelShape shape;
  Precision precision = Precision::bf16;
  AttentionKernel attention_kernel = AttentionKernel::auto_select;
  int micro_batch = 0, seq = 0, reserve = 0;
  double cool_down_s = 0.0;
  std::string choices_path;
};

po::options_description search_options(RawOptions& raw) {
  po::options_description general = help_section("General");
  add_help_option(general);
  po::options_description model = help_section("Model");
  add_model_shape_options(model, raw.shape, raw.shape.model);
  add_vocab_option(model, &raw.vocab);
  po::options_description backend = help_section("Backend and precision (cuda, 16-bit: the GEMMs a choice file serves)");
  add_backend_options(backend, raw.backend);
  po::options_description search = help_section("Search");
  search.add_options()
      ("micro-batch", po::value(&raw.micro_batch),
       "samples a rank's forward takes at once: train's --batch-per-rank (or its share of --global-batch) "
       "over --grad-accum; required");
  add_seq_option(search, &raw.seq);
  search.add_options()
      ("reserve", defaulted(&raw.reserve),
       "also choose for backward's GEMMs sized for the multiprocessors an overlapped lane of this many "
       "CTAs leaves (train --overlap on on 2 or more ranks, --overlapped-ctas; auto is 4); 0: none")
      ("cool-down-s", defaulted(&raw.cool_down_s),
       "seconds the GPU idles after a search that timed a GEMM, so that a run started next does not meet "
       "a GPU held at its power cap for minutes; 0: none");
  add_gemm_algos_file_option(search, &raw.choices_path);
  po::options_description all = help_sections();
  all.add(general).add(model).add(backend).add(search);
  return all;
}

std::string search_help() {
  RawOptions raw;
  std::ostringstream out;
  out << "Usage: scalestudy gemm-search --micro-batch B --gemm-algos-file FILE [options]\n"
         "Runs one training step of the model at micro-batch B on one GPU and times each 16-bit GEMM of it\n"
         "under sustained load against cuBLASLt's first eight candidates and eight configurations near them,\n"
         "keeping the fastest where it is at least 1 % faster than the default. The choices go into FILE,\n"
         "which train --gemm-algos-file reads; 25-35 s a GEMM shape, 10-12 minutes for GPT-2 small.\n"
      << search_options(raw);
  return out.str();
}

GemmSearchConfig resolve(const RawOptions& raw, const po::variables_map& values) {
  for (const char* option : {"micro-batch", "gemm-algos-file"})
    if (!given(values, option)) throw UsageError(std::string("the option '--") + option + "' is required but missing");
  check_backend(raw.backend.backend);
  if (raw.backend.backend != "cuda") bad_value("backend", raw.backend.backend, "gemm-search chooses cuBLAS's algorithms: cuda only");
  GemmSearchConfig c;
  c.shape = resolve_model_shape(raw.shape, values);
  apply_vocab(c.shape, raw.vocab);
  c.precision = resolve_precision(raw.backend.precision, raw.backend.backend);
  if (!is_16bit(c.precision)) bad_value("precision", raw.backend.precision, "must be bf16 or fp16: fp32 GEMMs take no choices");
  c.attention_kernel = parse_attention_kernel(raw.backend.attention_kernel, raw.backend.backend, c.precision);
  if (raw.seq < 0 || raw.seq > c.shape.max_seq)
    bad_value("seq", std::to_string(raw.seq), "must be 1 to the preset's " + std::to_string(c.shape.max_seq));
  if (raw.reserve < 0) bad_value("reserve", std::to_string(raw.reserve), "must not be negative");
  if (!(raw.cool_down_s >= 0.0 && raw.cool_down_s <= 3600.0)) {
    std::ostringstream text;
    text << raw.cool_down_s;
    bad_value("cool-down-s", text.str(), "must be 0 to 3600");
  }
  if (raw.micro_batch < 1) bad_value("micro-batch", std::to_string(raw.micro_batch), "must be at least 1");
  if (raw.choices_path.empty()) bad_value("gemm-algos-file", "''", "is empty: name the file to make or add to");
  c.micro_batch = raw.micro_batch;
  c.seq = raw.seq > 0 ? raw.seq : c.shape.max_seq;
  c.reserve = raw.reserve;
  c.cool_down_s = raw.cool_down_s;
  c.choices_path = raw.choices_path;
  return c;
}

#if SCALESTUDY_HAVE_CUDA
// The file's choices so far, or none where it does not exist; one made for another
// machine, or not in the format, is bad input: extending it would mix machines.
cuda::GemmChoiceFile existing_choices(const std::string& path, const std::string& machine) {
  if (!std::filesystem::exists(path)) return {};
  try {
    cuda::GemmChoiceFile choices = cuda::GemmChoiceFile::read(path, machine);
    if (!choices.set_aside_because().empty()) bad_value("gemm-algos-file", path, choices.set_aside_because());
    return choices;
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--gemm-algos-file ") + error.what());
  }
}

// One forward and backward, as a training step runs them, each GEMM's algorithm chosen at
// its first call; backward's GEMMs sized for the multiprocessors `backward_reserve` leaves,
// as beside an overlapped lane, which runs in backward only (forward's GEMMs keep the whole
// device). The results are not used.
void run_step(CudaOps& ops, Gpt& model, const GemmSearchConfig& c, int backward_reserve) {
  const size_t tokens = size_t(c.micro_batch) * size_t(c.seq);
  const std::vector<int32_t> inputs = random_tokens(tokens, c.shape.vocab, 1);
  const std::vector<int32_t> targets = random_tokens(tokens, c.shape.vocab, 2);
  FlatGradients sink(ops, model);
  const float loss_scale = 1.0f / static_cast<float>(tokens);
  model.forward(inputs.data(), targets.data(), nullptr, loss_scale);
  ops.reserve_multiprocessors(backward_reserve);
  model.backward(sink, loss_scale);
  ops.synchronize();
  ops.reserve_multiprocessors(0);
}

int search(const GemmSearchConfig& c) {
  const OutputLock lock(c.choices_path, "gemm-algos-file");
  const std::string machine = cuda::gemm_machine(0);
  cuda::GemmChoiceFile choices = existing_choices(c.choices_path, machine);
  std::printf("scalestudy gemm-search: micro-batch %d, seq %d, vocab %d, reserve %d, on %s; %zu choices in %s\n",
              c.micro_batch, c.seq, c.shape.vocab, c.reserve, machine.c_str(), choices.size(), c.choices_path.c_str());
  std::fflush(stdout);
  auto chooser = std::make_shared<cuda::SustainedChooser>(
      choices, c.choices_path, machine, cuda::SustainedTiming{}, [&](const cuda::SustainedChoiceMade& made) {
        std::printf("choice %zu: %s: %s, %.4g ms a call sustained (default %.4g ms)\n", choices.size(),
                    made.shape.c_str(), made.algorithm.c_str(), made.kept_ms, made.default_ms);
        std::fflush(stdout);
      });
  const AttentionKernel attention = choose_attention_kernel("cuda", c.precision, c.attention_kernel);
  CudaOps ops(0, c.precision, GemmAlgos::heuristic, attention, chooser);
  const ParameterLayout layout = make_parameter_layout(c.shape);
  Gpt model(ops, c.shape, c.micro_batch, c.seq, layout.param_elems);
  ParameterCache(1).initialize(ops, model);
  // Backward runs at both sizings in training: its top share before the overlapped lane
  // starts (--overlap-after), the rest beside it.
  run_step(ops, model, c, 0);
  if (c.reserve > 0) run_step(ops, model, c, c.reserve);
  std::printf("%d GEMM shapes searched, %zu choices in %s for %s\n", chooser->searched(), choices.size(),
              c.choices_path.c_str(), machine.c_str());
  if (chooser->searched() > 0 && c.cool_down_s > 0) {
    std::printf("cooling down for %g s\n", c.cool_down_s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(c.cool_down_s));
  }
  return 0;
}
#endif

}  // namespace

int run_gemm_search_command(int argc, const char* const* argv) {
  RawOptions raw;
  const po::options_description options = search_options(raw);
  po::variables_map values;
  parse_options(argc, argv, options, values);
  if (values.count("help")) {
    std::printf("%s", search_help().c_str());
    return 0;
  }
  const GemmSearchConfig config = resolve(raw, values);
#if SCALESTUDY_HAVE_CUDA
  return search(config);
#else
  (void)config;
  throw UsageError("this build has no CUDA backend");  // check_backend refused already
#endif
}

}  // namespace scalestudy
