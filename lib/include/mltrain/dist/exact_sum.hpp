#pragma once
// The mean of per-shard fp32 tensors whose bits do not depend on which rank holds which shard nor
// on the order of the additions (distributed.invariance: bitwise). Floating-point addition is not
// associative, so any world-dependent reduction tree moves the last bits; sums of integers below
// 2^53 held in doubles are exact in any order. Each element is rounded once onto a grid shared by
// every shard and rank: per segment (one parameter or buffer) the power of two 2^-k with
// k = B - e, where 2^e bounds the largest magnitude over all V shards (agreed with one all-gather
// of the segment maxima) and B = min(51, 52 - ceil(log2 V)), so that any sum of V grid values is
// an integer below 2^53. Each rank sums its shards' grid values in double (exactly), one plain
// all-reduce sums the ranks' (exactly), and the exact sum is scaled back and divided by V. An
// element keeps its 24 fp32 bits down to 2^(B-24) times below its segment's largest element
// (2^-23 for V = 12), fewer below; a non-finite element makes its segment NaN, for gradient
// health to see. The arithmetic is IEEE multiply/add/divide only, so every ISA gives the same bits.
//
//   ExactMean em(/*total_shards=*/12);
//   auto mean = em.mean({{w0, b0}, {w1, b1}}, comm);   // this rank's shards, each its segments
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace mltrain::dist {

class Comm;

class ExactMean {
 public:
  explicit ExactMean(int64_t total_shards);
  // local[s][g]: segment g of this rank's shard s, a contiguous fp32 CPU tensor of the same size in
  // every shard (and on every rank of `comm`, whose other ranks hold the rest of the shards; comm
  // nullptr: every shard is local). Returns each segment's mean, flat: the same bits on every rank
  // and in every world.
  // maxima[s]: shard s's maxima() when the caller took them while the shard was still in cache
  // (empty: mean() reads every shard once more for them); the result is the same bits.
  std::vector<torch::Tensor> mean(const std::vector<std::vector<torch::Tensor>>& local, Comm* comm,
                                  const std::vector<std::vector<float>>& maxima = {}) const;
  // The largest magnitude of each segment of one shard (infinity where one is not finite).
  static std::vector<float> maxima(const std::vector<torch::Tensor>& shard);

 private:
  int64_t shards_ = 1;
};

}  // namespace mltrain::dist
