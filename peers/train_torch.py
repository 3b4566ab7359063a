#!/usr/bin/env python3
"""The PyTorch side of peers/bench_vs_pytorch.py: GPT-2 written the way nanoGPT's
`model.py` and `train.py` write it for speed, timed on one GPU, or on several through DDP
under torchrun.

The model follows nanoGPT (github.com/karpathy/nanoGPT): token plus learned position
embeddings; per block LayerNorm, the QKV `nn.Linear`, `F.scaled_dot_product_attention`
(causal; bidirectional for the BERT presets), the output `nn.Linear` and a residual add,
then LayerNorm, `nn.Linear` to 4C, GELU, `nn.Linear` back to C and a residual add; a final
LayerNorm and the LM head, an `nn.Linear` without bias whose weight is the token
embedding's; `F.cross_entropy` over the logits as autocast gives them. Two choices follow
scalestudy rather than nanoGPT, so that both sides do the same arithmetic: GELU is the tanh
approximation (GPT-2's own), and the vocabulary is the one given (`--vocab`; nanoGPT pads
GPT-2's 50257 to 50304, a multiple of 64, and bench_vs_pytorch.py runs both sizes on both
sides).

The step is nanoGPT's: bf16 autocast (or fp32, with TF32 off so that fp32 means fp32),
backward, gradient clipping at norm 1, fused AdamW (lr 6e-4, betas 0.9 and 0.95, weight
decay 0.1 on the matrices and embeddings only), gradients set to None. The weights start
as GPT-2's (init_weights); random tokens, drawn once. With `--mode compile` the model is
compiled with `torch.compile` (and wrapped in DDP after, as nanoGPT does); with `--mode
max-autotune`, with `torch.compile(mode="max-autotune")`, which times Triton's GEMM
templates against cuBLAS for each shape and replays the step's kernels as CUDA graphs:
PyTorch's tuned step, the peer of a scalestudy run that reads a `scalestudy gemm-search`
file. Compilation happens in the warm-up steps.

Each measured step is timed between two CUDA events on the current stream; on several GPUs
a step's time is the slowest rank's. Prints one line, `RESULT {json}`, with the median step
(of an even count, the mean of the two middle steps) and the job's tokens per second.
"""
import argparse
import json
import os
import statistics

# layers, hidden, heads, vocab, max_seq: the presets of `scalestudy info` that this side builds.
PRESETS = {"gpt2-small": (12, 768, 12, 50257, 1024), "gpt2-medium": (24, 1024, 16, 50257, 1024),
           "bert-large": (24, 1024, 16, 30522, 512)}


def padded_vocab(vocab, multiple=64):
    """The vocabulary rounded up to a multiple of 64, as nanoGPT pads GPT-2's: the LM head's
    GEMMs then tile evenly."""
    return -(-vocab // multiple) * multiple


def build_model(name, vocab=None, device=None):
    """The preset's model at `vocab` (default: the preset's), on `device`; returns it and its
    vocabulary."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    layers, hidden, heads, preset_vocab, max_seq = PRESETS[name]
    vocab = vocab or preset_vocab
    causal = not name.startswith("bert")

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(hidden, 4 * hidden)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(hidden), SelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(hidden), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.wte.weight = self.lm_head.weight  # tied, as in GPT-2

        def forward(self, idx, targets):
            positions = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(positions)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    with torch.device(device or "cpu"):
        model = GPT()
    init_weights(model, layers)
    return model, vocab


def init_weights(model, layers):
    """GPT-2's initialisation, as nanoGPT and scalestudy give it: matrices and embeddings
    N(0, 0.02), the residual projections N(0, 0.02/sqrt(2 layers)), biases 0, LayerNorm 1
    and 0. The values matter to speed, not only to training: a GPU at its power cap runs
    the same GEMMs at different clocks for operands of different magnitudes."""
    import torch
    import torch.nn as nn

    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                residual = name.endswith("c_proj")
                module.weight.normal_(0.0, 0.02 / (2 * layers) ** 0.5 if residual else 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()


def adamw(model, fused=True):
    """nanoGPT's optimizer: weight decay on the parameters of two dimensions or more."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=fused)


def measure(args):
    import torch
    import torch.nn as nn

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        torch.distributed.init_process_group("nccl")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, vocab = build_model(args.model, args.vocab, device="cuda")
    optimizer = adamw(model)
    step_model = model
    if args.mode == "compile":
        step_model = torch.compile(model)
    elif args.mode == "max-autotune":
        step_model = torch.compile(model, mode="max-autotune")
    if world > 1:
        step_model = nn.parallel.DistributedDataParallel(step_model, device_ids=[local])
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    generator = torch.Generator(device="cuda").manual_seed(1234 + rank)
    data = torch.randint(0, vocab, (args.batch_per_gpu, args.seq + 1), device="cuda", generator=generator)
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=args.precision == "bf16"):
            loss = step_model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    if world > 1:
        slowest = torch.tensor(times, device="cuda")
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        times = slowest.tolist()
        torch.distributed.destroy_process_group()
    if rank == 0:
        # The median of an even count is the mean of the two middle values, as in scalestudy's
        # /summary, so that both sides are read alike.
        median = statistics.median(times)
        tokens_per_s = args.batch_per_gpu * args.seq * world / median
        print("RESULT " + json.dumps({"median_step_s": median, "tokens_per_s": tokens_per_s, "vocab": vocab}),
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(PRESETS), required=True)
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch-per-gpu", type=int, required=True)
    parser.add_argument("--mode", choices=("eager", "compile", "max-autotune"), required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    measure(parser.parse_args())


if __name__ == "__main__":
    main()
