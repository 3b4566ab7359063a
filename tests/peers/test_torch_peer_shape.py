"""The PyTorch training peer (peers/train_torch.py) builds the model scalestudy trains:
for every preset it builds, the same parameter count and the same training FLOPs per token
as `scalestudy info` gives, so that a ratio of tokens/s is a ratio of speed on the same
work. PyTorch's side is counted on the meta device (shapes only, no memory, no GPU):
parameters once each (the LM head's weight is the embedding's), and the FLOPs of a forward
and backward by torch.utils.flop_counter, which counts every matrix product, attention's
included, from the operators actually dispatched.

Needs PyTorch and the scalestudy binary (SCALESTUDY_BINARY); skipped without either."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "peers"))
import train_torch  # noqa: E402

BINARY = os.environ.get("SCALESTUDY_BINARY")
pytestmark = pytest.mark.skipif(not BINARY, reason="set SCALESTUDY_BINARY to the scalestudy binary")


def scalestudy_presets():
    """name -> (parameters, training FLOPs per token) from `scalestudy info --json`."""
    listing = subprocess.run([BINARY, "info", "--json"], capture_output=True, text=True, check=True).stdout
    return {preset["name"]: (preset["parameters"], preset["train_flops_per_token"])
            for preset in json.loads(listing)["presets"]}


def peer_counts(name, vocab=None):
    """The peer's parameters and training FLOPs per token at the preset's sequence length."""
    model, vocab = train_torch.build_model(name, vocab, device="meta")
    parameters = sum(p.numel() for p in model.parameters())  # a tied tensor is listed once
    seq = train_torch.PRESETS[name][4]
    tokens = torch.zeros((1, seq), dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(tokens, tokens).backward()
    return parameters, counter.get_total_flops() / seq


@pytest.mark.parametrize("name", sorted(train_torch.PRESETS))
def test_the_peer_has_scalestudys_parameters_and_flops_per_token(name):
    parameters, flops_per_token = peer_counts(name)
    ours_parameters, ours_flops_per_token = scalestudy_presets()[name]
    assert parameters == ours_parameters
    # Both are sums of products of the shape's integers, far below 2^53: exact but for the
    # division by the sequence length, which float64 rounds to 1e-16 or so.
    assert flops_per_token == pytest.approx(ours_flops_per_token, rel=1e-12)


def test_the_padded_vocabulary_adds_only_the_tied_tables_rows():
    layers, hidden, heads, vocab, max_seq = train_torch.PRESETS["gpt2-small"]
    padded = train_torch.padded_vocab(vocab)
    assert padded == 50304
    base, base_flops = peer_counts("gpt2-small")
    wider, wider_flops = peer_counts("gpt2-small", padded)
    assert wider - base == (padded - vocab) * hidden
    # The LM head's forward and backward: 3 x 2 FLOPs per multiply-add per token.
    assert wider_flops - base_flops == pytest.approx(6 * hidden * (padded - vocab), rel=1e-12)


def test_the_peer_starts_from_gpt2s_initialisation():
    layers = train_torch.PRESETS["gpt2-small"][0]
    model, _ = train_torch.build_model("gpt2-small")
    # A normal tensor of 768 x 768 or more: its sample deviation lies within 2 % of the
    # true one (the standard error of a deviation over n samples is 1/sqrt(2n)).
    assert model.wpe.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.h[0].attn.c_proj.weight.std().item() == pytest.approx(0.02 / (2 * layers) ** 0.5, rel=0.02)
    assert model.h[0].mlp.c_fc.bias.abs().max().item() == 0
    assert model.h[0].ln_1.weight.min().item() == 1
