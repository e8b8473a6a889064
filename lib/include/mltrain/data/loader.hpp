#pragma once
// Batches from a Dataset: worker threads gather samples straight into reused batch tensors
// (normalised on the fly), handing them over through a bounded ring of `prefetch` slots.
//
//   Loader loader(train, {.batch_size = 128, .workers = 2, .seed = 0});
//   loader.start_epoch(epoch, /*first_batch=*/0);
//   Batch b;
//   while (loader.next(b)) { train_step(b.x, b.y); }   // b's slot is reused once b is reset/reassigned
//
// The sample order is a pure function of (seed, epoch, rank, world) — see epoch_order() — so a
// checkpoint needs only {epoch, batch index} to resume mid-epoch exactly, and {epoch, samples
// consumed} to resume it in a world of another size.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mltrain/data/augment.hpp"
#include "mltrain/data/dataset.hpp"

namespace mltrain::data {

struct LoaderOptions {
  int64_t batch_size = 128;
  int64_t workers = 0;   // 0: gather on the calling thread
  int64_t prefetch = 4;  // slots in the ring (>= workers)
  bool shuffle = true;
  bool drop_last = true;
  uint64_t seed = 0;
  int64_t rank = 0, world = 1;
  float mean = 0.f, std = 1.f;  // x = (pixel/255 - mean) / std for u8; (x - mean) / std for f32
  bool pin_memory = false;      // slots in page-locked memory (only where CUDA exists)
  int64_t shuffle_window = 4;   // chunk sets: chunks whose samples are shuffled together
  bool cover_all = false;  // world > 1, evaluation: rank r reads samples r, r + world, ... (every
                           // sample once over the ranks, unshuffled) instead of an even share
  std::vector<double> class_weights;  // non-empty: weighted_order (data.sampler: weighted)
  // > 0 (distributed.invariance: bitwise): the epoch's order is cut into global batches of this
  // many samples; rank r of a world W reads the r-th contiguous 1/W of each (rank_share), and
  // batch_size must be global_block / W.
  int64_t global_block = 0;
};

// Indices this rank visits in `epoch`. Every rank gets floor((N - skip) / world) samples of one
// global permutation (strided by rank), so the union over ranks is a permutation without repeats.
// The permutation depends on (seed, epoch) only, never on the world: `skip` samples of it already
// consumed (by any world) leave its rest to be shared by this one. After k batches of B on every
// rank of a world W, exactly the first skip + k*B*W entries have been consumed.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, int64_t rank,
                                 int64_t world, bool shuffle, int64_t skip = 0, int64_t block = 0);

// data.sampler: weighted. An epoch of ds.count draws with replacement, sample i drawn with
// probability proportional to class_weights[label(i)], from one stream per (seed, epoch), then the
// rank share: like epoch_order a pure function of its arguments and never of the world.
std::vector<int64_t> weighted_order(const Dataset& ds, const std::vector<double>& class_weights,
                                    uint64_t seed, int64_t epoch, int64_t rank, int64_t world,
                                    int64_t skip = 0, int64_t block = 0);

// The even rank share of a global permutation past its first `skip` entries: rank r takes
// perm[skip + r], perm[skip + r + world], ...  With `block` > 0 (a global batch; the world divides
// it) the rest is cut into whole blocks and rank r takes the r-th contiguous block / world entries
// of each, so the samples of any 1/V of a block are the same whatever the world.
std::vector<int64_t> rank_share(const std::vector<int64_t>& perm, int64_t rank, int64_t world,
                                int64_t skip = 0, int64_t block = 0);

// Chunk sets: the chunks of samples [offset, offset + n) in a seeded order, the samples of each
// group of `window` chunks shuffled together, then the rank share. A pure function of its
// arguments, so {epoch, batch} still resumes mid-epoch exactly; at most ~2 windows of chunks are
// being read at any time.
std::vector<int64_t> chunked_order(int64_t n, int64_t offset, int64_t chunk, int64_t window,
                                   uint64_t seed, int64_t epoch, int64_t rank, int64_t world,
                                   int64_t skip = 0, int64_t block = 0);

// Workers for `auto`: enough to keep one consumer fed without starving the compute threads.
// The field guide's rule, per node: min(the node's usable cores, 4 x its GPUs where there are
// GPUs, chunks where the data is a chunk set); `gpus` or `chunks` 0: that term is left out. The
// node's workers are shared among its `local_ranks` (at least 1 each).
int64_t auto_workers(int64_t cores, int64_t gpus = 0, int64_t chunks = 0, int64_t local_ranks = 1);

struct Batch {
  torch::Tensor x, y;           // x: float [B, sample_shape...]; y: int64 [B] class ids, or float
                                // [B, target_shape...] for data sets with float targets; token
                                // windows: x and y int64 [B, T], y = x shifted by one token
  torch::Tensor y2;             // mixup/cutmix partner labels (undefined when not mixed)
  double lam = 1.0;             // weight of y in the loss; 1 - lam for y2
  int64_t index = -1;           // batch number within the epoch
  std::shared_ptr<void> lease;  // releases the slot when the last copy goes away
  // Samples [start, start + len) as views (micro-batches); the whole batch when len covers it.
  Batch rows(int64_t start, int64_t len) const {
    Batch part = *this;
    if (len == y.size(0)) return part;
    part.x = x.narrow(0, start, len);
    part.y = y.narrow(0, start, len);
    if (y2.defined()) part.y2 = y2.narrow(0, start, len);
    return part;
  }
};

class Loader {
 public:
  Loader(Dataset ds, LoaderOptions opt);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;
  // Batches of an epoch whose first `skip` global samples were consumed before (a resume in
  // another world): batches_per_epoch() when skip is 0.
  int64_t batches_after(int64_t skip) const;
  // `skip`: global samples of this epoch's order already consumed (see epoch_order); `first_batch`
  // counts batches of the rest, in this world.
  void start_epoch(int64_t epoch, int64_t first_batch = 0, int64_t skip = 0);
  int64_t batches_this_epoch() const;  // of the epoch started last
  // The sample indices of batch b of the epoch started last (tests, tools: what a batch holds).
  std::vector<int64_t> batch_samples(int64_t b) const;
  bool next(Batch& out);        // false when the epoch is done
  double wait_seconds() const;  // total time next() spent blocked on workers
  // Augmentation (training loader only): applied in the workers; progress for each op's window is
  // (epoch * batches_per_epoch + batch) / total_batches.
  void set_augmenter(std::shared_ptr<Augmenter> aug, int64_t total_batches);
  Augmenter* augmenter() const { return aug_.get(); }
  double augment_seconds() const;   // summed over workers
  double fill_cpu_seconds() const;  // thread CPU time spent preparing batches, summed over threads
  int64_t filled_samples() const;
  int64_t augmented_samples() const;
  const LoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return ds_; }

 private:
  struct State;
  void stop_workers();
  int64_t epoch_position(int64_t i) const;  // of the i-th sample this rank reads this epoch
  int64_t global_batch(int64_t b) const;    // of this rank's batch b
  void fill(int64_t b, torch::Tensor& x, torch::Tensor& y, torch::Tensor& y2, double& lam);
  template <class Slot>
  void timed_fill(int64_t b, Slot& slot);
  Dataset ds_;
  LoaderOptions opt_;
  std::shared_ptr<State> st_;
  std::shared_ptr<Augmenter> aug_;
  int64_t total_batches_ = 1, epoch_ = 0;
};

// Converts n u8 pixels to normalised floats (vectorised for the host CPU at run time).
void normalize_u8(const uint8_t* src, float* dst, int64_t n, float scale, float shift);

}  // namespace mltrain::data
