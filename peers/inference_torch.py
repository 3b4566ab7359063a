"""The PyTorch side of peers/inference_vs_pytorch.py: an encoder of scalestudy's shape
and math in fp16, timed at each (batch, seq) point in eager mode and under torch.compile.

The math is scalestudy's forward (src/model/gpt_inference.cpp): token plus learned position
embeddings; per block LayerNorm, the QKV dense layer with bias, scaled_dot_product_attention
(scale 1/sqrt(head size), causal for the GPT presets, bidirectional for the BERT presets),
the output dense layer and a residual add, then LayerNorm, dense 4C with bias, tanh GELU,
dense C and a residual add; a final LayerNorm; the LM head tied to the token embedding,
logits = x @ wte^T without bias, all of them returned. Weights and activations are fp16;
PyTorch's LayerNorm and attention kernels accumulate in fp32. LayerNorm's epsilon is 1e-5.

What is compiled, and how often: the embedding, one block and the head are three functions
that take their weights as arguments. By default (scope "whole") the forward is one graph,
every block in it, as torch.compile(model) gives a user; with scope "regional" each region
is compiled alone, so the 12 or 24 blocks run one compiled block. torch.compile runs in its
default mode with dynamic=False, so it compiles once for each (batch, seq); dynamo's caches
are reset before each shape, so a point runs only the code made for it. Compilation happens
in the warm-up, outside the timed samples, and its wall time is recorded.

The two scopes trade compile time for host time. Both run the same GPU work, but a whole
graph takes several times longer to compile per shape, while regionally the host enters
each compiled block in turn, which shows where the GPU work is small (a batch of a few
short sequences): there the whole graph is the faster PyTorch, and the fair peer.
"""
import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LAYERNORM_EPS = 1e-5
INIT_STD = 0.02


@dataclass
class Timing:
    """How a point is timed: warm-up calls, then samples of back-to-back calls between two
    CUDA events on the current stream, each sample at least min_sample_s long. Sampling
    stops at `samples`, or once the samples have taken budget_s and there are min_samples."""
    warmup_calls: int = 1
    min_sample_s: float = 0.02
    samples: int = 5
    min_samples: int = 3
    budget_s: float = 1.0


@dataclass
class EncoderWeights:
    wte: torch.Tensor
    wpe: torch.Tensor
    blocks: list  # per block: the tuple block_forward unpacks
    lnf_weight: torch.Tensor
    lnf_bias: torch.Tensor


def make_weights(shape, dtype=torch.float16, seed=1234):
    """Random weights of `shape` (the dict inference_vs_pytorch reads from a bench file)."""
    c, vocab = shape["hidden"], shape["vocab"]
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def normal(*size):
        return (torch.randn(*size, generator=generator, device="cuda") * INIT_STD).to(dtype)

    def ones(size):
        return torch.ones(size, device="cuda", dtype=dtype)

    def zeros(size):
        return torch.zeros(size, device="cuda", dtype=dtype)

    blocks = [(ones(c), zeros(c), normal(3 * c, c), zeros(3 * c), normal(c, c), zeros(c),
               ones(c), zeros(c), normal(4 * c, c), zeros(4 * c), normal(c, 4 * c), zeros(c))
              for _ in range(shape["layers"])]
    return EncoderWeights(normal(vocab, c), normal(shape["max_seq"], c), blocks, ones(c), zeros(c))


def embed(tokens, wte, wpe):
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    return F.embedding(tokens, wte) + F.embedding(positions, wpe)


def make_block_forward(heads, causal):
    def block_forward(x, weights):
        ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b = weights
        b, t, c = x.shape
        q, k, v = F.linear(F.layer_norm(x, (c,), ln1_w, ln1_b, LAYERNORM_EPS), qkv_w, qkv_b).split(c, dim=2)
        q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + F.linear(y.transpose(1, 2).reshape(b, t, c), proj_w, proj_b)
        h = F.gelu(F.linear(F.layer_norm(x, (c,), ln2_w, ln2_b, LAYERNORM_EPS), fc_w, fc_b), approximate="tanh")
        return x + F.linear(h, out_w, out_b)
    return block_forward


def head(x, lnf_weight, lnf_bias, wte):
    return F.layer_norm(x, (x.shape[-1],), lnf_weight, lnf_bias, LAYERNORM_EPS) @ wte.t()


class Encoder:
    """The forward as three regions. compile_scope None runs them eagerly; "regional"
    compiles each region alone, "whole" the forward as one graph."""

    def __init__(self, shape, weights, compile_scope=None):
        regions = (embed, make_block_forward(shape["heads"], shape["attention"] == "causal"), head)
        if compile_scope == "regional":
            regions = tuple(torch.compile(region, dynamic=False) for region in regions)
        self.embed, self.block, self.head = regions
        self.weights = weights
        self.forward = torch.compile(self.eager_forward, dynamic=False) if compile_scope == "whole" else \
            self.eager_forward

    def __call__(self, tokens):
        return self.forward(tokens)

    def eager_forward(self, tokens):
        w = self.weights
        x = self.embed(tokens, w.wte, w.wpe)
        for block_weights in w.blocks:
            x = self.block(x, block_weights)
        return self.head(x, w.lnf_weight, w.lnf_bias, w.wte)


def time_calls(call, timing):
    """(per-call seconds of each sample, calls per sample, warm-up wall seconds)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    started = time.perf_counter()
    for _ in range(timing.warmup_calls):
        call()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - started
    # A further call, timed alone, sizes the samples; it is not one of them.
    begin.record()
    call()
    end.record()
    end.synchronize()
    single_s = begin.elapsed_time(end) / 1e3
    calls = max(1, math.ceil(timing.min_sample_s / max(single_s, 1e-9)))
    per_call, spent_s = [], 0.0
    while len(per_call) < timing.samples and (len(per_call) < timing.min_samples or spent_s < timing.budget_s):
        begin.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        sample_s = begin.elapsed_time(end) / 1e3
        spent_s += sample_s
        per_call.append(sample_s / calls)
    return per_call, calls, warmup_s


def free_memory():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def summarize(point, per_call_s):
    """Median and quartiles (linear interpolation, as numpy and the bench files use) in ms."""
    q1, median, q3 = statistics.quantiles(per_call_s, n=4, method="inclusive")
    point.update(latency_ms=median * 1e3, q1_ms=q1 * 1e3, q3_ms=q3 * 1e3,
                 sequences_per_s=point["batch"] / median, samples_s=per_call_s)


def compiled_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def out_of_memory_cause(error):
    """The torch.OutOfMemoryError behind `error`, if one is: torch.compile wraps one raised
    while compiling (inductor times candidate kernels on real tensors) in its own error."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, torch.OutOfMemoryError):
            return error
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def run_point(shape, weights, mode, batch, seq, timing, compile_scope):
    """One (mode, batch, seq) point: a dict with status ok and its timings, or oom."""
    point = {"batch": batch, "seq": seq, "mode": mode}
    if mode == "compile":
        torch._dynamo.reset()
    graphs_before = compiled_graphs()
    encoder = Encoder(shape, weights, compile_scope if mode == "compile" else None)
    generator = torch.Generator(device="cuda").manual_seed(batch * 100003 + seq)
    torch.cuda.reset_peak_memory_stats()
    oom_detail = None
    try:
        tokens = torch.randint(0, shape["vocab"], (batch, seq), device="cuda", generator=generator)
        # Each call's logits are dropped as it returns, as a server hands them on, so they
        # are freed before the next call allocates its own.
        per_call_s, calls, warmup_s = time_calls(lambda: encoder(tokens), timing)
    except Exception as error:  # noqa: BLE001 (anything but running out of memory is re-raised)
        if out_of_memory_cause(error) is None:
            raise
        oom_detail = "torch.OutOfMemoryError" + ("" if isinstance(error, torch.OutOfMemoryError)
                                                 else f" inside {type(error).__name__}")
    # Freed after the except clause, which holds the failed call's frames and their tensors.
    encoder = tokens = None
    free_memory()
    if oom_detail is not None:
        point.update(status="oom", detail=oom_detail)
        return point
    point.update(status="ok", detail="", calls_per_sample=calls, warmup_s=warmup_s,
                 peak_allocated_bytes=torch.cuda.max_memory_allocated())
    if mode == "compile":
        point["compiled_graphs"] = compiled_graphs() - graphs_before
    summarize(point, per_call_s)
    return point


def run_grid(shape, modes, batches, seqs, timing, compile_scope="whole", progress=print):
    """Every point of the grid, sequence length by sequence length, batches rising. Once a
    mode runs out of memory at a batch, its larger batches at that length are not tried
    (they need more of every tensor) and are recorded as oom with that reason."""
    points = []
    with torch.inference_mode():
        weights = make_weights(shape)
        for seq in seqs:
            oom_at = {}
            for batch in batches:
                for mode in modes:
                    if mode in oom_at:
                        point = {"batch": batch, "seq": seq, "mode": mode, "status": "oom",
                                 "detail": f"not run: batch {oom_at[mode]} at this length ran out of memory"}
                    else:
                        point = run_point(shape, weights, mode, batch, seq, timing, compile_scope)
                        if point["status"] == "oom":
                            oom_at[mode] = batch
                    points.append(point)
                    progress(describe_point(point))
        weights = None
    free_memory()
    return points


def describe_point(point):
    where = f"pytorch {point['mode']} batch {point['batch']} seq {point['seq']}"
    if point["status"] != "ok":
        return f"{where}: {point['status']} ({point['detail']})"
    return (f"{where}: latency {point['latency_ms']:.4g} ms [IQR {point['q1_ms']:.4g}-{point['q3_ms']:.4g}] "
            f"over {len(point['samples_s'])} samples of {point['calls_per_sample']} call(s); "
            f"warm-up {point['warmup_s']:.1f} s")


def versions():
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda or "none",
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}
