#!/usr/bin/env python3
"""The PyTorch side of jobscripts/bench_vs_pytorch.py: the training step of a model of
scalestudy's shape and math, timed on one GPU, or on several through DDP under torchrun.

The model is GPT-2's (or, for the BERT presets, the same blocks without the causal mask):
token plus learned position embeddings; per block LayerNorm, the QKV dense layer,
scaled_dot_product_attention, the output dense layer and a residual add, then LayerNorm,
dense 4C, tanh GELU, dense C and a residual add; a final LayerNorm and the LM head tied to
the token embedding; cross-entropy in fp32 over the logits. The step is scalestudy's: bf16
autocast (or fp32), backward, gradient clipping at norm 1, fused AdamW (lr 6e-4, betas 0.9
and 0.95, weight decay 0.1). Random tokens, drawn once. With `--mode compile` the model runs
under torch.compile; compilation happens in the warm-up steps.

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


def build_model(name):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    layers, hidden, heads, vocab, max_seq = PRESETS[name]
    causal = not name.startswith("bert")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc, self.fc_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(hidden)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    return Transformer(), vocab


def measure(args):
    import torch
    import torch.nn as nn

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        torch.distributed.init_process_group("nccl")
    model, vocab = build_model(args.model)
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=True)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    step_model = torch.compile(model) if args.mode == "compile" else model
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator(device="cuda").manual_seed(1234 + rank)
    tokens = torch.randint(0, vocab, (args.batch_per_gpu, args.seq + 1), device="cuda", generator=generator)

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=args.precision == "bf16"):
            loss = step_model(tokens[:, :-1], tokens[:, 1:])
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
        print("RESULT " + json.dumps({"median_step_s": median, "tokens_per_s": tokens_per_s}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(PRESETS), required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch-per-gpu", type=int, required=True)
    parser.add_argument("--mode", choices=("eager", "compile"), required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    measure(parser.parse_args())


if __name__ == "__main__":
    main()
