#pragma once
// How the flat parameter/gradient buffer is cut into buckets and shards.
//
// Every bucket holds a multiple of world_size * kAlignElems elements, so each bucket
// splits into world_size equal chunks, and rank r's shard is its chunk of every bucket,
// back to back: bucket b's chunk starts at shard offset begin/world_size. The buffer is
// padded (with zeros that stay zero) to make this hold for any world size, odd ones too.
//
// The embeddings' gradients, at the start of the buffer, are finished last: the embedding
// backward and then the tied LM head's weight gradient, which the model computes in parts
// that end where these buckets begin (GradientSink::segment_cuts), from the last rows down.
// Their buckets end where the embeddings end (rounded up to whole chunks), so that no
// block's gradients wait with them for the end of backward, and only the lowest one is
// left for the tail that backward cannot hide.
#include <cstddef>
#include <vector>

namespace scalestudy {

struct Bucket {
  size_t begin_elems = 0;
  size_t end_elems = 0;
  size_t elems() const { return end_elems - begin_elems; }
};

struct BucketPlan {
  static constexpr size_t kAlignElems = 32;  // 128 bytes of fp32 per chunk boundary
  int world_size = 1;
  size_t param_elems = 0;   // unpadded
  size_t padded_elems = 0;
  size_t bucket_elems = 0;  // the largest bucket
  std::vector<Bucket> buckets;

  size_t shard_elems() const { return padded_elems / static_cast<size_t>(world_size); }
  // elems rounded up to whole chunks: a multiple of world_size * kAlignElems.
  size_t round_up_to_chunks(size_t elems) const {
    const size_t granule = static_cast<size_t>(world_size) * kAlignElems;
    return (elems + granule - 1) / granule * granule;
  }
  size_t chunk_elems(int bucket) const { return buckets[bucket].elems() / static_cast<size_t>(world_size); }
  // Rank r's chunk of bucket b, in the flat buffer.
  size_t chunk_begin(int bucket, int rank) const {
    return buckets[bucket].begin_elems + static_cast<size_t>(rank) * chunk_elems(bucket);
  }
  size_t shard_offset(int bucket) const { return buckets[bucket].begin_elems / world_size; }
};

// bucket_bytes is rounded up to whole chunks; a bucket larger than the model gives one
// bucket per region, a bucket smaller than one tensor gives many. last_finished_elems
// (the embeddings' end; 0 for none) splits the buffer in two regions: the one below is
// cut into as few buckets of equal size as bucket_bytes allows, the one above into
// buckets of bucket_bytes from its end down, the lowest one shorter.
BucketPlan make_bucket_plan(size_t param_elems, double bucket_bytes, int world_size,
                            size_t last_finished_elems = 0);

}  // namespace scalestudy
