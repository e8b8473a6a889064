#pragma once
// distributed.invariance: bitwise — training whose weights are the same bits in every world that
// divides V = distributed.virtual_shards, and after a resume in any such world:
//   data       the global batch (train.global_batch = G) is cut into V fixed shards of G/V samples,
//              always the same ones (data::rank_share with a block of G); rank r of W reads
//              shards [r V/W, (r+1) V/W);
//   compute    each shard runs its own forward and backward (ghost BatchNorm: its statistics are
//              the shard's), from the step's starting buffers, with the RNG keyed by (seed, step,
//              shard), on a copy of its samples in freshly aligned memory, with
//              distributed.invariance_threads intra-op threads on every rank;
//   combine    shard gradients and BatchNorm running statistics are averaged by dist::ExactMean
//              (an exact integer sum: no order, so no tree, to agree on).
// The trainer calls run() for each loader batch, which is the whole optimizer step of this rank.
//
//   InvariantShards inv(cfg, model, comm);
//   inv.run(batch, step, [&](const data::Batch& shard) { ... forward, backward, sums ... });
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/dist/exact_sum.hpp"
#include "mltrain/model/model.hpp"

namespace mltrain::dist {
class Comm;
}

namespace mltrain::train {

// Worlds that divide distributed.virtual_shards, as text ("1, 2, 3, 4, 6, 12").
std::string invariant_worlds(int64_t virtual_shards);
// ConfigError (exit 2) when `world` does not divide distributed.virtual_shards.
void check_invariant_world(const config::ExperimentConfig& cfg, int64_t world);

class InvariantShards {
 public:
  InvariantShards(const config::ExperimentConfig& cfg, model::Model& model, dist::Comm* comm);
  int64_t shard_samples() const { return shard_; }
  int64_t shards_here() const { return here_; }
  // The loader batch's shards through `forward_backward` (which must leave the shard's gradient
  // in the parameters' .grad), then the exact mean over all V shards written into .grad and the
  // floating-point buffers; the RNG is left keyed by the step, whatever ran last.
  void run(const data::Batch& batch, int64_t step,
           const std::function<void(const data::Batch&)>& forward_backward);

 private:
  void reseed(int64_t step, int64_t slot) const;
  dist::Comm* comm_;
  uint64_t seed_;
  int64_t shards_ = 1, shard_ = 1, here_ = 1, first_ = 0;
  model::NamedTensors params_, float_buffers_, buffers_;
  dist::ExactMean mean_;
  // Per local shard, one segment per tensor: its gradient of every parameter (moved out of .grad,
  // never copied), then its floating-point buffers after its forward; one exact mean for both.
  std::vector<std::vector<torch::Tensor>> shards_out_;
  std::vector<std::vector<float>> maxima_;  // per local shard, its segments' largest magnitudes
};

}  // namespace mltrain::train
