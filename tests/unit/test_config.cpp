// The command line, the presets, the parameter layout and the FLOP accounting; and the
// refusals: values that could pass for a default, and paths and config files that could be
// misread, are each refused with a UsageError that names the option (or the file and its
// line), in one line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "model/parameter_layout.h"
#include "parallel/bucket_plan.h"
#include "scratch_folder.h"
#include "training.h"

namespace scalestudy {
namespace {

RunConfig parse(const std::vector<std::string>& args) { return parse_train_options(args); }

// The UsageError's one-line message for these arguments; fails the test when there is none.
std::string refusal(const std::vector<std::string>& args) {
  try {
    parse_train_options(args);
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "accepted: " << testing::PrintToString(args);
  return "";
}

// Expects a UsageError whose one-line message contains every fragment.
void expect_usage_error(const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
  const std::string message = refusal(args);
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
}

TEST(Presets, PublishedGpt2ParameterCounts) {
  // Radford et al. (2019) with the 50257-token vocabulary and a tied LM head; the counts
  // match the published Hugging Face checkpoints.
  const std::vector<std::pair<std::string, size_t>> published = {
      {"gpt2-small", 124439808}, {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
  for (const auto& [name, count] : published) {
    EXPECT_EQ(make_parameter_layout(find_model_preset(name).shape).param_elems, count) << name;
  }
}

TEST(Presets, LayoutIsContiguousAndSegmentsTileIt) {
  const ParameterLayout layout = make_parameter_layout(find_model_preset("gpt2-small").shape);
  size_t cursor = 0;
  for (const auto& tensor : layout.tensors) {
    EXPECT_EQ(tensor.offset_elems, cursor) << tensor.name;
    cursor += tensor.elems;
  }
  EXPECT_EQ(cursor, layout.param_elems);
  ASSERT_EQ(layout.segments.size(), 14u);  // embeddings, 12 blocks, final norm
  for (size_t s = 1; s < layout.segments.size(); ++s)
    EXPECT_EQ(layout.segments[s].begin_elems, layout.segments[s - 1].end_elems);
  EXPECT_EQ(layout.segments.back().end_elems, layout.param_elems);
}

TEST(Flops, SeedFormula) {
  // gpt2-small, b=1, s=1024: 12·(24·1024·768² + 4·1024²·768) + 2·1024·768·50257.
  const ModelShape shape = find_model_preset("gpt2-small").shape;
  const double expected_forward = 12.0 * (24.0 * 1024 * 768.0 * 768 + 4.0 * 1024 * 1024 * 768) +
                                  2.0 * 1024 * 768 * 50257;
  EXPECT_DOUBLE_EQ(forward_flops(shape, 1, 1024), expected_forward);
  EXPECT_DOUBLE_EQ(training_flops(shape, 1, 1024), 3 * expected_forward);
  // Recomputation runs the blocks' forward again, not the logits layer.
  EXPECT_DOUBLE_EQ(recompute_flops(shape, 1, 1024), expected_forward - 2.0 * 1024 * 768 * 50257);
}

TEST(Config, DefaultsResolveFromThePreset) {
  const RunConfig c = parse({"--model", "gpt2-small"});
  EXPECT_EQ(c.shape.layers, 12);
  EXPECT_EQ(c.seq, 1024);
  EXPECT_EQ(c.scaling, Scaling::weak);
  EXPECT_EQ(c.batch_per_rank, 4);
  const RunConfig bert = parse({"--model", "bert-large"});
  EXPECT_FALSE(bert.shape.causal);
}

TEST(Config, OverridesWin) {
  const RunConfig c = parse({"--model", "gpt2-small", "--layers", "3", "--hidden", "128", "--heads", "8",
                             "--seq", "64", "--attention", "bidirectional", "--strategy", "zero2",
                             "--overlap", "on", "--global-batch", "8", "--grad-reduce", "bf16"});
  EXPECT_EQ(c.shape.layers, 3);
  EXPECT_EQ(c.shape.channels, 128);
  EXPECT_FALSE(c.shape.causal);
  EXPECT_EQ(c.strategy, Strategy::zero2);
  EXPECT_TRUE(c.overlap);
  EXPECT_EQ(c.grad_reduce, Precision::bf16);
  EXPECT_EQ(parse({}).grad_reduce, Precision::fp32);
  EXPECT_EQ(c.scaling, Scaling::strong);
}

using ConfigFile = ScratchFolder;

TEST_F(ConfigFile, IsReadAndTheCommandLineWins) {
  const std::string path =
      write("experiment.ini", "# an experiment file\nmodel = tiny\nsteps = 7\nstrategy = zero2\nlr = 0.002\n");
  const RunConfig c = parse({"--config", path, "--steps", "9"});
  EXPECT_EQ(c.steps, 9);  // the command line wins
  EXPECT_EQ(c.strategy, Strategy::zero2);
  EXPECT_FLOAT_EQ(c.learning_rate, 0.002f);
}

TEST(Config, BadInputNamesTheOptionAndValue) {
  expect_usage_error({"--comm-engine", "copy"}, {"comm-engine"});
  expect_usage_error({"--overlapped-ctas", "-1"}, {"--overlapped-ctas -1", "negative"});
  expect_usage_error({"--overlapped-ctas", "65"}, {"--overlapped-ctas 65", "at most 64"});
  expect_usage_error({"--overlapped-ctas", "8", "--overlap", "on"}, {"--overlapped-ctas 8", "needs --backend cuda"});
  expect_usage_error({"--overlapped-ctas", "four"}, {"--overlapped-ctas four", "auto or a whole number"});
  expect_usage_error({"--overlapped-ctas", "4x"}, {"--overlapped-ctas 4x", "auto or a whole number"});
  EXPECT_EQ(parse({}).overlapped_ctas, 0) << "auto is 0 on the cpu backend";
  EXPECT_EQ(parse({"--overlapped-ctas", "0"}).overlapped_ctas, 0);
  if (SCALESTUDY_HAVE_CUDA) {
    EXPECT_EQ(parse({"--backend", "cuda", "--overlap", "on"}).overlapped_ctas, kAutoOverlappedCtas);
    EXPECT_EQ(parse({"--backend", "cuda"}).overlapped_ctas, 0) << "without overlap every collective is awaited";
    expect_usage_error({"--backend", "cuda", "--overlapped-ctas", "4"}, {"--overlapped-ctas 4", "needs --overlap on"});
    EXPECT_EQ(parse({"--backend", "cuda", "--overlapped-ctas", "0"}).overlapped_ctas, 0);
  }
  expect_usage_error({"--overlap-after", "1", "--overlap", "on"}, {"--overlap-after 1", "up to (not including) 1"});
  expect_usage_error({"--overlap-after", "-0.1", "--overlap", "on"}, {"--overlap-after -0.1", "from 0"});
  expect_usage_error({"--overlap-after", "half", "--overlap", "on"}, {"--overlap-after half", "auto or a number"});
  expect_usage_error({"--overlap-after", "0.5x", "--overlap", "on"}, {"--overlap-after 0.5x", "auto or a number"});
  expect_usage_error({"--overlap-after", "nan", "--overlap", "on"}, {"--overlap-after nan", "auto or a number"});
  expect_usage_error({"--overlap-after", "0.5"}, {"--overlap-after 0.5", "needs --overlap on"});
  EXPECT_EQ(parse({"--overlap-after", "0.5", "--overlap", "on", "--strategy", "zero2"}).overlap_after, 0.5)
      << "zero2 holds its buckets too, at the price of their staging";
  EXPECT_EQ(parse({"--overlap", "on"}).overlap_after, kAutoOverlapAfter) << "auto, ddp with overlap";
  EXPECT_EQ(parse({}).overlap_after, 0.0) << "auto without overlap";
  for (const int world : {1, 2, 4, 8}) {
    RunConfig zero2 = parse({"--overlap", "on", "--strategy", "zero2"});
    resolve_for_world(zero2, world);
    EXPECT_EQ(zero2.overlap_after, std::min(kAutoOverlapAfter, 1.0 / world))
        << "auto for zero2 on " << world << " ranks: at most one shard of gradients held";
    RunConfig ddp = parse({"--overlap", "on"});
    resolve_for_world(ddp, world);
    EXPECT_EQ(ddp.overlap_after, kAutoOverlapAfter) << "auto for ddp on " << world << " ranks";
    RunConfig chosen = parse({"--overlap", "on", "--strategy", "zero2", "--overlap-after", "0.75"});
    resolve_for_world(chosen, world);
    EXPECT_EQ(chosen.overlap_after, 0.75) << "a chosen share stays, on " << world << " ranks";
    // The file records what was asked for, which a series shares, beside what it became.
    const auto described = describe_config(zero2);
    const auto value_of = [&](const std::string& name) {
      for (const auto& [key, value] : described)
        if (key == name) return value;
      return std::string("(absent)");
    };
    EXPECT_EQ(value_of("overlap_after"), "auto");
    EXPECT_EQ(std::stod(value_of("overlap_after_resolved")), zero2.overlap_after) << world << " ranks";
  }
  EXPECT_EQ(parse({"--overlap", "on", "--overlap-after", "0"}).overlap_after, 0.0);
  EXPECT_EQ(parse({"--overlap", "on", "--overlap-after", "0.25"}).overlap_after, 0.25);
  EXPECT_EQ(parse({"--overlap-after", "0", "--strategy", "zero2"}).overlap_after, 0.0) << "0 asks for nothing";
  expect_usage_error({"--gemm-algos", "fastest"}, {"--gemm-algos fastest", "timed or heuristic"});
  EXPECT_EQ(parse({}).gemm_algos, GemmAlgos::timed);
  EXPECT_EQ(parse({"--gemm-algos", "heuristic"}).gemm_algos, GemmAlgos::heuristic);
  expect_usage_error({"--gemm-algos", "sustained"}, {"--gemm-algos sustained", "--gemm-algos-file", "docs/strategies.md"});
  const std::string readable = std::string(SCALESTUDY_SOURCE_DIR) + "/README.md";
  EXPECT_EQ(parse({"--gemm-algos-file", readable}).gemm_algos_file, readable);
  EXPECT_EQ(parse({"--gemm-algos", "heuristic", "--gemm-algos-file", readable}).gemm_algos, GemmAlgos::heuristic);
  expect_usage_error({"--gemm-algos-file", "/nonexistent/algos"}, {"--gemm-algos-file /nonexistent/algos", "cannot be read"});
  EXPECT_NE(train_help().find("clearly faster"), std::string::npos)
      << "the help states when a timed candidate is kept";
  EXPECT_NE(train_help().find("under sustained load"), std::string::npos) << "the help states how a file is made";
  expect_usage_error({"--no-such-option"}, {"no-such-option"});
  expect_usage_error({"--steps", "abc"}, {"steps", "abc"});
  expect_usage_error({"--steps", "0"}, {"--steps 0"});
  expect_usage_error({"--steps", "-3"}, {"--steps -3"});
  expect_usage_error({"--heads", "5"}, {"--heads 5", "--hidden 32"});
  expect_usage_error({"--seq", "65"}, {"--seq 65", "--max-seq 64"});
  expect_usage_error({"--hidden", "-8"}, {"--hidden -8"});
  expect_usage_error({"--model", "gpt5"}, {"--model gpt5"});
  expect_usage_error({"--strategy", "fsdp"}, {"--strategy fsdp"});
  expect_usage_error({"--overlap", "maybe"}, {"--overlap maybe"});
  expect_usage_error({"--global-batch", "8", "--batch-per-rank", "2"}, {"--global-batch 8", "--batch-per-rank"});
  expect_usage_error({"--warmup-steps", "20", "--steps", "20"}, {"--warmup-steps 20"});
  expect_usage_error({"--config", "/nonexistent/run.ini"}, {"--config /nonexistent/run.ini"});
  expect_usage_error({"--data", "file", "--token-file", "/nonexistent/tokens.bin"},
                     {"--token-file /nonexistent/tokens.bin"});
  expect_usage_error({"--precision", "bf16"}, {"--precision bf16", "cpu"});
  expect_usage_error({"--bucket-mb", "0"}, {"--bucket-mb 0"});
  expect_usage_error({"--grad-reduce", "fp16"}, {"--grad-reduce fp16"});
}

TEST(Config, GpuTelemetryIsOnByDefaultOnCudaAndRefusedOnTheCpu) {
  EXPECT_EQ(parse({}).gpu_telemetry_ms, 0) << "auto is off on the cpu";
  EXPECT_EQ(parse({"--gpu-telemetry-ms", "0"}).gpu_telemetry_ms, 0);
  expect_usage_error({"--gpu-telemetry-ms", "10"}, {"--gpu-telemetry-ms 10", "needs --backend cuda", "cpu"});
  expect_usage_error({"--gpu-telemetry-ms", "-1"}, {"--gpu-telemetry-ms -1", "0 (off) to 1000"});
  expect_usage_error({"--gpu-telemetry-ms", "1001"}, {"--gpu-telemetry-ms 1001", "0 (off) to 1000"});
  expect_usage_error({"--gpu-telemetry-ms", "often"}, {"--gpu-telemetry-ms often", "whole number"});
  const auto described = describe_config(parse({}));
  EXPECT_TRUE(std::any_of(described.begin(), described.end(),
                          [](const auto& entry) { return entry.first == "gpu_telemetry_ms" && entry.second == "0"; }));
  if (SCALESTUDY_HAVE_CUDA) {
    EXPECT_EQ(parse({"--backend", "cuda"}).gpu_telemetry_ms, kAutoGpuTelemetryMs);
    EXPECT_EQ(parse({"--backend", "cuda", "--gpu-telemetry-ms", "0"}).gpu_telemetry_ms, 0);
    EXPECT_EQ(parse({"--backend", "cuda", "--gpu-telemetry-ms", "1000"}).gpu_telemetry_ms, 1000);
  }
}

TEST(Config, LinkEmulationIsCheckedAndRefusedOnTheCpu) {
  EXPECT_EQ(parse({}).link_emulation, "none");
  expect_usage_error({"--link-emulation", "tcp"}, {"--link-emulation tcp", "none or socket"});
  expect_usage_error({"--link-emulation", "socket"}, {"--link-emulation socket", "needs --backend cuda", "MPI"});
  if (SCALESTUDY_HAVE_CUDA) {
    EXPECT_EQ(parse({"--backend", "cuda", "--link-emulation", "socket"}).link_emulation, "socket");
  }
}

TEST(Config, KernelProfileIsRefusedOnTheCpuAndItsWindowChecked) {
  expect_usage_error({"--profile-kernels"}, {"--profile-kernels", "--backend cuda", "cpu"});
  expect_usage_error({"--profile-window", "2-3"}, {"--profile-window 2-3", "needs --profile-kernels"});
  expect_usage_error({"--profile-kernels", "--profile-window", "5"}, {"--profile-window 5", "FIRST-LAST"});
  expect_usage_error({"--profile-kernels", "--profile-window", "7-5"}, {"--profile-window 7-5", "FIRST-LAST"});
  expect_usage_error({"--profile-kernels", "--profile-window", "5-7x"}, {"--profile-window 5-7x", "FIRST-LAST"});
  expect_usage_error({"--profile-kernels", "--steps", "8", "--profile-window", "5-8"},
                     {"--profile-window 5-8", "beyond the last step 7"});
  // An auto window on the cpu ends at the backend, before whether the steps leave room for
  // it: the backend is what the user must change. A window the user wrote is checked first.
  expect_usage_error({"--profile-kernels", "--steps", "5", "--warmup-steps", "2"}, {"--profile-kernels", "cpu"});
  expect_usage_error({"--profile-kernels", "--steps", "8", "--warmup-steps", "2", "--profile-window", "2-7"},
                     {"--profile-window 2-7", "no step after warm-up untraced"});
  expect_usage_error({"--profile-kernels", "--steps", "10", "--profile-window", "5-7"}, {"--profile-kernels", "cpu"});
  const RunConfig plain = parse({});
  EXPECT_FALSE(plain.profile_kernels);
  EXPECT_EQ(plain.profile_first, -1);
}

TEST(Config, StrongScalingMustDivideOverTheWorld) {
  RunConfig c = parse({"--global-batch", "12"});
  resolve_for_world(c, 4);
  EXPECT_EQ(c.batch_per_rank, 3);
  RunConfig odd = parse({"--global-batch", "12"});
  try {
    resolve_for_world(odd, 5);
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("--global-batch 12"), std::string::npos);
  }
  RunConfig accum = parse({"--batch-per-rank", "3", "--grad-accum", "2"});
  EXPECT_THROW(resolve_for_world(accum, 1), UsageError);
}

TEST(Config, HashSeesEveryOption) {
  const RunConfig a = parse({});
  const RunConfig b = parse({"--seed", "7"});
  EXPECT_EQ(config_hash(a), config_hash(parse({})));
  EXPECT_NE(config_hash(a), config_hash(b));
}

// --attention-kernel: auto stands for flash; cudnn needs cuda in a 16-bit precision, and
// anything else is refused naming the option, the value and what it needs. The result file
// records the attention the run computes with.
TEST(Config, AttentionKernelParsesAndRefuses) {
  EXPECT_EQ(parse({}).attention_kernel, AttentionKernel::auto_select);
  EXPECT_EQ(parse({"--attention-kernel", "flash"}).attention_kernel, AttentionKernel::flash);
  expect_usage_error({"--attention-kernel", "fast"}, {"--attention-kernel fast", "auto, flash or cudnn"});
  expect_usage_error({"--attention-kernel", "cudnn"}, {"--attention-kernel cudnn", "--backend cuda"});
  EXPECT_EQ(parse_attention_kernel("cudnn", "cuda", Precision::bf16), AttentionKernel::cudnn);
  for (const auto& [backend, precision] : {std::pair{"cuda", Precision::fp32}, std::pair{"cpu", Precision::fp32},
                                           std::pair{"cuda", Precision::fp16}}) {
    try {
      parse_attention_kernel("cudnn", backend, precision);
      ADD_FAILURE() << "cudnn accepted on " << backend << " in " << precision_name(precision);
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("--attention-kernel cudnn"), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(parse_attention_kernel("auto", "cuda", Precision::fp32), AttentionKernel::auto_select)
      << "fp32 keeps the unfused path whatever auto would pick";
  EXPECT_STREQ(attention_kernel_used(AttentionKernel::auto_select, true, Precision::bf16), "flash");
  EXPECT_STREQ(attention_kernel_used(AttentionKernel::cudnn, true, Precision::bf16), "cudnn");
  EXPECT_STREQ(attention_kernel_used(AttentionKernel::flash, true, Precision::fp32), "unfused");
  EXPECT_STREQ(attention_kernel_used(AttentionKernel::auto_select, false, Precision::fp32), "unfused");
  const auto described = describe_config(parse({"--attention-kernel", "flash"}));
  const auto recorded = std::find_if(described.begin(), described.end(),
                                     [](const auto& pair) { return pair.first == "attention_kernel"; });
  ASSERT_NE(recorded, described.end());
  EXPECT_EQ(recorded->second, "unfused") << "the cpu backend keeps the probabilities whatever is asked";
  EXPECT_NE(train_help().find("--attention-kernel"), std::string::npos);
}

TEST(Config, HelpComesFromTheDeclarations) {
  const std::string help = train_help();
  for (const char* option : {"--model", "--global-batch", "--batch-per-rank", "--grad-accum", "--strategy",
                             "--overlap", "--bucket-mb", "--grad-reduce", "--overlapped-ctas", "--overlap-after", "--gemm-algos", "--gemm-algos-file", "--check-every", "--config", "--token-file",
                             "--profile-kernels", "--profile-window"})
    EXPECT_NE(help.find(option), std::string::npos) << option;
}

TEST(Config, HelpGroupsTheOptionsBySection) {
  const std::string help = train_help();
  size_t previous = 0;
  for (const char* section : {"\nGeneral:", "\nModel:", "\nData:", "\nBatch and scaling:", "\nOptimizer (",
                              "\nData parallelism:", "\nBackend and precision:", "\nOutput:", "\nDiagnostics:",
                              "\nTuning ("}) {
    const size_t at = help.find(section);
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_GT(at, previous) << section << " out of order";
    previous = at;
  }
  // Each knob says why a user would set it.
  const size_t tuning = help.find("\nTuning (");
  for (const char* reason :
       {"to study how they slow the compute", "the same bits on every run", "how long buckets wait"})
    EXPECT_NE(help.find(reason, tuning), std::string::npos) << reason;
}

// The strategies see the resolved options, zero2's --overlap-after auto bounded for the world.
TEST(Config, DataParallelConfigCarriesWhatTheStrategiesRead) {
  RunConfig c = parse({"--strategy", "zero2", "--overlap", "on", "--bucket-mb", "0.01", "--grad-reduce", "bf16",
                       "--grad-clip", "0.5", "--beta1", "0.8", "--beta2", "0.99", "--eps", "1e-6",
                       "--weight-decay", "0.01"});
  resolve_for_world(c, 4);
  const DataParallelConfig parallel = c.data_parallel();
  EXPECT_EQ(parallel.strategy, Strategy::zero2);
  EXPECT_TRUE(parallel.overlap);
  EXPECT_EQ(parallel.overlap_after, 0.25);
  EXPECT_EQ(parallel.bucket_bytes, 0.01 * 1024 * 1024);
  EXPECT_EQ(parallel.grad_reduce, Precision::bf16);
  EXPECT_EQ(parallel.grad_clip, 0.5f);
  EXPECT_EQ(parallel.adamw.beta1, 0.8f);
  EXPECT_EQ(parallel.adamw.beta2, 0.99f);
  EXPECT_EQ(parallel.adamw.epsilon, 1e-6f);
  EXPECT_EQ(parallel.adamw.weight_decay, 0.01f);
  const DataParallelConfig defaults = parse({}).data_parallel();
  EXPECT_EQ(defaults.strategy, Strategy::ddp);
  EXPECT_FALSE(defaults.overlap);
  EXPECT_EQ(defaults.bucket_bytes, DataParallelConfig{}.bucket_bytes);
  EXPECT_EQ(defaults.grad_clip, DataParallelConfig{}.grad_clip);
  EXPECT_EQ(defaults.adamw.beta2, AdamWConfig{}.beta2);
}

// The keys of a result file's /config, which the analysis package reads.
TEST(Config, DescribedNamesStayTheResultFilesKeys) {
  const std::vector<std::string> expected = {
      "model", "layers", "hidden", "heads", "vocab", "max_seq", "attention", "seq", "recompute", "scaling",
      "global_batch", "batch_per_rank", "grad_accum", "steps", "warmup_steps", "lr", "min_lr_ratio",
      "lr_warmup_steps", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "loss_scaling", "loss_scale_init",
      "loss_scale_growth_interval", "data", "token_file", "seed", "strategy", "overlap", "bucket_mb", "grad_reduce",
      "overlapped_ctas", "overlap_after", "overlap_after_resolved", "check_every", "comm_timeout", "link_emulation",
      "backend", "precision", "gemm_algos", "gemm_algos_file", "attention_kernel", "output", "flush_every", "experiment", "repeat",
      "profile_kernels", "profile_window", "gpu_telemetry_ms",
      "world_size"};
  std::vector<std::string> names;
  for (const auto& [name, value] : describe_config(parse({}))) names.push_back(name);
  EXPECT_EQ(names, expected);
}

TEST(BucketPlan, EveryBucketSplitsEvenlyForAnyWorldSize) {
  for (int world : {1, 2, 3, 4, 5, 7}) {
    for (double bucket_bytes : {100.0, 4096.0, 1e9}) {
      const BucketPlan plan = make_bucket_plan(29568 + 13, bucket_bytes, world);
      EXPECT_GE(plan.padded_elems, plan.param_elems);
      EXPECT_LT(plan.padded_elems - plan.param_elems, static_cast<size_t>(world) * BucketPlan::kAlignElems);
      size_t cursor = 0;
      for (size_t b = 0; b < plan.buckets.size(); ++b) {
        EXPECT_EQ(plan.buckets[b].begin_elems, cursor);
        EXPECT_EQ(plan.buckets[b].elems() % (static_cast<size_t>(world) * BucketPlan::kAlignElems), 0u);
        cursor = plan.buckets[b].end_elems;
      }
      EXPECT_EQ(cursor, plan.padded_elems);
      if (bucket_bytes >= 1e9) {
        EXPECT_EQ(plan.buckets.size(), 1u);
      }
    }
  }
}

// The embeddings' gradients are finished last: their buckets hold nothing else but the
// padding to a whole chunk, so no block's gradient waits with them. Above them the buckets
// are cut from the end, where backward starts: only the lowest, started last, is shorter.
TEST(BucketPlan, TheEmbeddingsBucketsEndWhereTheEmbeddingsEnd) {
  const size_t param_elems = 29568 + 13, embedding_elems = 1000 + 7;
  for (int world : {1, 2, 3, 4, 7}) {
    const size_t granule = static_cast<size_t>(world) * BucketPlan::kAlignElems;
    const size_t embedding_end = (embedding_elems + granule - 1) / granule * granule;
    for (double bucket_bytes : {100.0, 1024.0, 4096.0, 1e9}) {
      const BucketPlan plan = make_bucket_plan(param_elems, bucket_bytes, world, embedding_elems);
      const size_t requested = (static_cast<size_t>(bucket_bytes / sizeof(float)) + granule - 1) / granule * granule;
      size_t cursor = 0, largest = 0, smallest_below = plan.padded_elems, largest_below = 0;
      bool ends_at_embedding_end = false;
      for (const Bucket& bucket : plan.buckets) {
        EXPECT_EQ(bucket.begin_elems, cursor);
        EXPECT_EQ(bucket.elems() % granule, 0u);
        EXPECT_LE(bucket.elems(), requested) << "world " << world << ", " << bucket_bytes << " bytes";
        EXPECT_FALSE(bucket.begin_elems < embedding_end && bucket.end_elems > embedding_end)
            << "a bucket straddles the embeddings' end";
        ends_at_embedding_end = ends_at_embedding_end || bucket.end_elems == embedding_end;
        if (bucket.begin_elems > embedding_end) {
          EXPECT_EQ(bucket.elems(), requested) << "only the lowest bucket above the embeddings is shorter";
        }
        if (bucket.end_elems <= embedding_end) {
          smallest_below = std::min(smallest_below, bucket.elems());
          largest_below = std::max(largest_below, bucket.elems());
        }
        largest = std::max(largest, bucket.elems());
        cursor = bucket.end_elems;
      }
      EXPECT_EQ(cursor, plan.padded_elems);
      EXPECT_TRUE(ends_at_embedding_end);
      EXPECT_LE(largest_below - smallest_below, granule) << "the embeddings' buckets are of equal size";
      EXPECT_EQ(plan.bucket_elems, largest);
      if (bucket_bytes >= 1e9) {
        EXPECT_EQ(plan.buckets.size(), 2u);
      }
    }
  }
}

TEST(ConfigRefusals, SentinelsAndNonFiniteNumbers) {
  expect_usage_error({"--global-batch", "0"}, {"--global-batch 0", "at least 1"});
  expect_usage_error({"--warmup-steps", "-1"}, {"--warmup-steps -1", "at least 0"});
  expect_usage_error({"--seed", "-1"}, {"--seed -1"});
  expect_usage_error({"--seed", "12x"}, {"--seed 12x"});
  for (const char* option : {"--lr", "--grad-clip", "--weight-decay", "--bucket-mb", "--comm-timeout", "--beta1"})
    for (const char* value : {"inf", "nan"}) expect_usage_error({option, value}, {std::string(option) + " " + value});
  EXPECT_EQ(parse_train_options({"--seed", "0"}).seed, 0u);
  EXPECT_EQ(parse_train_options({"--seed", "18446744073709551615"}).seed, 18446744073709551615ull);
}

TEST(ConfigRefusals, CommTimeoutHasBounds) {
  // Below 1 s a healthy start outlasts it; far above, the deadline leaves the clock's range.
  for (const char* seconds : {"4.9e-324", "0.002", "0.99", "-3", "1000001", "1e300"})
    expect_usage_error({"--comm-timeout", seconds}, {"--comm-timeout ", "must be 1 to 1e6 s"});
  EXPECT_EQ(parse_train_options({"--comm-timeout", "1"}).comm_timeout_s, 1.0);
  EXPECT_EQ(parse_train_options({"--comm-timeout", "1e6"}).comm_timeout_s, 1e6);
  EXPECT_NE(train_help().find("1 to 1e6 s"), std::string::npos);
}

TEST(ConfigRefusals, ZeroIsNoSilentDefault) {
  // Left out, each of these means the preset's value (or 4, or --max-seq); given as 0, it
  // would be taken for that without a word.
  for (const char* option : {"--layers", "--hidden", "--heads", "--vocab", "--max-seq", "--seq", "--batch-per-rank"})
    expect_usage_error({option, "0"}, {std::string(option) + " 0", "at least 1", "leave it out"});
  EXPECT_EQ(parse_train_options({"--layers", "1"}).shape.layers, 1);
}

TEST(ConfigRefusals, SeedAndExperimentText) {
  expect_usage_error({"--seed", " 5"}, {"--seed  5", "whole number"});
  expect_usage_error({"--seed", "+5"}, {"--seed +5", "whole number"});
  expect_usage_error({"--experiment", "sweep\nrm -rf /"}, {"--experiment 'sweep\\x0arm -rf /'", "control character"});
  expect_usage_error({"--experiment", "a\x1b[2Jb"}, {"--experiment", "control character"});
  EXPECT_EQ(parse_train_options({"--experiment", "strong scaling, 2024"}).experiment, "strong scaling, 2024");
}

TEST(ConfigRefusals, StrayArgumentsAndAbbreviations) {
  expect_usage_error({"--steps", "3", "stray"}, {"unexpected argument 'stray'"});
  expect_usage_error({"--outp", "x.h5"}, {"--outp"});
  expect_usage_error({"--strat", "ddp"}, {"--strat"});
}

using ConfigPaths = ScratchFolder;

TEST_F(ConfigPaths, OutputPaths) {
  expect_usage_error({"--output", ""}, {"--output", "empty"});
  expect_usage_error({"--output", folder()}, {"--output " + folder(), "is a directory"});
  const std::string existing = write("done.h5", "a result");
  expect_usage_error({"--output", existing}, {"--output " + existing, "--overwrite"});
  EXPECT_EQ(parse_train_options({"--output", existing, "--overwrite"}).output, existing);
  const std::string tokens = write("tokens.bin", "not really tokens");
  expect_usage_error({"--data", "file", "--token-file", tokens, "--output", tokens, "--overwrite"},
                 {"--output " + tokens, "--token-file"});
  const std::string config = write("run.ini", "steps = 3\n");
  expect_usage_error({"--config", config, "--output", config, "--overwrite"}, {"--output " + config, "--config"});
}

TEST_F(ConfigPaths, TokenFilesThatAreNoFiles) {
  expect_usage_error({"--data", "file", "--token-file", folder()}, {"--token-file", "is a directory"});
  const std::string fifo = path("tokens.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_usage_error({"--data", "file", "--token-file", fifo}, {"--token-file " + fifo, "not a regular file"});
  expect_usage_error({"--data", "file", "--token-file", path("none.bin")}, {"no such file"});
}

TEST(ConfigRefusals, ProfileKernelsOnTheCpuNamesTheBackend) {
  expect_usage_error({"--profile-kernels"}, {"--profile-kernels", "--backend cuda"});
  expect_usage_error({"--nonfinite-loss", "ignore"}, {"--nonfinite-loss ignore", "stop or continue"});
}

TEST_F(ConfigPaths, ConfigFilesNameTheFileAndLine) {
  expect_usage_error({"--config", folder()}, {"--config " + folder(), "not a regular file"});
  expect_usage_error({"--config", path("missing.ini")}, {"missing.ini", "no such file"});
  const std::string unknown = write("unknown.ini", "steps = 3\n\nbogus = 1\n");
  expect_usage_error({"--config", unknown}, {unknown + ":3", "bogus"});
  const std::string bad = write("bad.ini", "steps = abc\n");
  expect_usage_error({"--config", bad}, {bad + ":1", "steps"});
  const std::string nested = write("nested.ini", "steps = 3\nconfig = " + unknown + "\n");
  expect_usage_error({"--config", nested}, {nested + ":2", "config ="});
  const std::string binary = write("binary.ini", std::string("steps = 3\n\x7f" "ELF\x01\x02", 15));
  expect_usage_error({"--config", binary}, {binary + ":2", "not a text file"});
  EXPECT_EQ(parse_train_options({"--config", write("good.ini", "steps = 7\r\n")}).steps, 7);
}

TEST_F(ConfigPaths, ConfigFileThatFailsToReadIsNoEmptyFile) {
  // The first page of /proc/self/mem is unmapped: its read fails (EIO) at once.
  expect_usage_error({"--config", "/proc/self/mem"}, {"--config /proc/self/mem: cannot be read: Input/output error"});
  // A UTF-8 byte-order mark, as editors on Windows write, is no part of the first key;
  // the lines keep their numbers.
  const std::string bom = write("bom.ini", "\xEF\xBB\xBFsteps = 7\nlayers = 2\n");
  EXPECT_EQ(parse_train_options({"--config", bom}).steps, 7);
  const std::string bom_bad = write("bom_bad.ini", "\xEF\xBB\xBFsteps = x\n");
  expect_usage_error({"--config", bom_bad}, {bom_bad + ":1", "'steps'"});
}

TEST_F(ConfigPaths, ConfigFileErrorsNameTheLineWhereverTheyAreFound) {
  // Lines that Boost cannot read, named by the line Boost quotes or the key it names.
  const std::string no_equals = write("no_equals.ini", "steps = 3\nlayers 2\n");
  expect_usage_error({"--config", no_equals}, {no_equals + ":2", "invalid line"});
  const std::string dashes = write("dashes.ini", "\n--layers = 2\n");
  expect_usage_error({"--config", dashes}, {dashes + ":2", "--layers"});
  const std::string section = write("section.ini", "steps = 3\n[train]\nlayers = 2\n");
  expect_usage_error({"--config", section}, {section + ":3", "train.layers"});
  const std::string twice = write("twice.ini", "layers = 2\nsteps = 3\nlayers = 4\n");
  expect_usage_error({"--config", twice}, {twice + ":3", "more than once"});
  const std::string help = write("help.ini", "steps = 3\nhelp = 1\n");
  expect_usage_error({"--config", help}, {help + ":2", "help ="});
  // A bad line is refused even where the command line overrides it.
  const std::string overridden = write("overridden.ini", "layers = two\n");
  expect_usage_error({"--config", overridden, "--layers", "2"}, {overridden + ":1", "layers", "two"});
  // Values that Boost reads and the checks refuse name the file's line too.
  const std::string values = write("values.ini", "steps = 3\n\nlr = inf\n");
  expect_usage_error({"--config", values}, {values + ":3", "--lr inf", "finite"});
  const std::string strategy = write("strategy.ini", "strategy = zero3\n");
  expect_usage_error({"--config", strategy}, {strategy + ":1", "--strategy zero3"});
  const std::string zero = write("zero.ini", "steps = 3\nlayers = 0\n");
  expect_usage_error({"--config", zero}, {zero + ":2", "--layers 0"});
  // The command line's own bad values name no file.
  expect_usage_error({"--config", write("fine.ini", "steps = 3\n"), "--lr", "nan"}, {"--lr nan"});
  EXPECT_EQ(refusal({"--config", write("fine2.ini", "steps = 3\n"), "--lr", "nan"}).find("--config"), std::string::npos);
}

}  // namespace
}  // namespace scalestudy
