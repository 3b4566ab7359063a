#pragma once
// `scalestudy bench layer`: one transformer block, by default at bert-large size (hidden
// 1024, 16 heads, bidirectional), forward and forward+backward, over batches × seqs; and
// its parts on their own at one batch and seq (64 and 128 by default): the FFN's first
// dense layer, that layer with its GELU, the whole FFN, the attention sub-layer and the
// attention core.
//
// The block runs as scalestudy::Gpt with one layer, so it is exactly the code training
// runs. That model also has an embedding, a final LayerNorm, a tied LM head and the
// loss; the vocabulary is cut to kLayerVocab so that the head's 2·b·s·h·V FLOPs are a
// fraction of a percent of the block's at h = 1024. The FLOPs counted are the whole
// 1-layer model's, from src/model/flops.h:
//   forward  = 24·b·s·h² + 4·b·s²·h + 2·b·s·h·V,  forward+backward = 3 × forward.
// The parts call the backend's ops directly; their FLOPs are in bench_model.h.
#include "bench/bench_common.h"
#include "bench/bench_model.h"

namespace scalestudy {

inline constexpr int kLayerVocab = 64;

// The 1-layer model the block is timed as: `shape` with layers = 1 and V = kLayerVocab.
ModelShape layer_model_shape(const ModelShape& shape);

// Bytes that the parts' buffers take on `backend` (they share one set: every activation,
// gradient and weight of a block, plus attention backward's scratch).
size_t parts_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq);

void run_layer_bench(BenchContext& context);

}  // namespace scalestudy
