#pragma once
// `scalestudy bench layer`: one transformer block, by default at bert-large size (hidden
// 1024, 16 heads, bidirectional), forward and forward+backward, over batches × seqs; and
// its parts on their own at one batch and seq (64 and 128 by default): the FFN's first
// dense layer, that layer with its GELU, the whole FFN, the attention sub-layer and the
// attention core.
//
// The block is timed as the code training runs: scalestudy::Gpt with one layer and with
// two, and the block's rows are the difference, sample by sample. What every model pays
// once (the embedding, the final LayerNorm, the tied LM head and the loss, and the launch
// of each pass) drops out, so the block's rate is the one a deep model's blocks reach.
// Both models' rows are kept ("model-1-layer", "model-2-layers"). The vocabulary is cut
// to kLayerVocab. FLOPs are src/model/flops.h's:
//   model forward = L·(24·b·s·h² + 4·b·s²·h) + 2·b·s·h·V, forward+backward = 3 × forward;
//   block forward = 24·b·s·h² + 4·b·s²·h (the 2-layer model's less the 1-layer's).
// The parts call the backend's ops directly; their FLOPs are in bench_model.h.
#include "bench/bench_common.h"
#include "bench/bench_model.h"

namespace scalestudy {

inline constexpr int kLayerVocab = 64;

// The 1-layer model of the block's timing: `shape` with layers = 1 and V = kLayerVocab.
ModelShape layer_model_shape(const ModelShape& shape);

// Bytes that the parts' buffers take on `backend` (they share one set: every activation,
// gradient and weight of a block, plus attention backward's scratch).
size_t parts_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq);

void run_layer_bench(BenchContext& context);

}  // namespace scalestudy
