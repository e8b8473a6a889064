#include "mltrain/data/loader.hpp"

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"

#include "mltrain/core/rng.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>

namespace mltrain::data {

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, int64_t rank,
                                 int64_t world, bool shuffle, int64_t skip, int64_t block) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  if (shuffle) {
    // One stream per (seed, epoch); changing this formula reorders every existing run.
    SplitMix rng{seed * 0x100000001B3ull ^ (static_cast<uint64_t>(epoch) + 0x51ED270B27ull)};
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(perm[static_cast<size_t>(i)], perm[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  return rank_share(perm, rank, world, skip, block);
}

std::vector<int64_t> weighted_order(const Dataset& ds, const std::vector<double>& class_weights,
                                    uint64_t seed, int64_t epoch, int64_t rank, int64_t world,
                                    int64_t skip, int64_t block) {
  const int64_t n = ds.count;
  if (!ds.labels)
    throw DataError(ds.source, "data.sampler: weighted draws by class label and this set has none",
                    "use data.sampler.name=uniform");
  std::vector<double> cum(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = ds.label(i);
    total += c >= 0 && c < int64_t(class_weights.size()) ? class_weights[size_t(c)] : 0.0;
    cum[static_cast<size_t>(i)] = total;
  }
  if (!(total > 0))
    throw DataError(ds.source, "data.sampler: no training sample has a class weight above 0",
                    "give a class present in the training split a weight > 0");
  // Its own stream per (seed, epoch), apart from epoch_order's.
  SplitMix rng{seed * 0x100000001B3ull ^ (static_cast<uint64_t>(epoch) + 0x3C6EF372FE94F82Bull)};
  std::vector<int64_t> draws(static_cast<size_t>(n));
  for (auto& d : draws) {
    const double u = double(rng.next() >> 11) * 0x1.0p-53 * total;  // [0, total)
    d = std::min<int64_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin(), n - 1);
  }
  return rank_share(draws, rank, world, skip, block);
}

std::vector<int64_t> rank_share(const std::vector<int64_t>& perm, int64_t rank, int64_t world,
                                int64_t skip, int64_t block) {
  const int64_t n = static_cast<int64_t>(perm.size());
  skip = std::clamp<int64_t>(skip, 0, n);
  if (block > 0) {  // whole global batches only; rank r reads the r-th contiguous part of each
    const int64_t w = std::max<int64_t>(1, world), part = block / w;
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>((n - skip) / block * part));
    for (int64_t j = 0; skip + (j + 1) * block <= n; ++j)
      for (int64_t t = 0; t < part; ++t)
        mine.push_back(perm[static_cast<size_t>(skip + j * block + rank * part + t)]);
    return mine;
  }
  if (world <= 1) return {perm.begin() + skip, perm.end()};
  const int64_t per_rank = (n - skip) / world;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k)
    mine.push_back(perm[static_cast<size_t>(skip + k * world + rank)]);
  return mine;
}

std::vector<int64_t> chunked_order(int64_t n, int64_t offset, int64_t chunk, int64_t window,
                                   uint64_t seed, int64_t epoch, int64_t rank, int64_t world,
                                   int64_t skip, int64_t block) {
  // Chunks (of the underlying set; a slice may start mid-chunk) in a seeded order, then the
  // samples of each group of `window` consecutive chunks shuffled together.
  const int64_t first = offset / chunk, last = (offset + n - 1) / chunk;
  std::vector<int64_t> chunks;
  for (int64_t c = first; c <= last; ++c) chunks.push_back(c);
  SplitMix rng{seed * 0x100000001B3ull ^ (static_cast<uint64_t>(epoch) + 0xC4A2C5ull)};
  for (size_t i = chunks.size(); i > 1; --i) std::swap(chunks[i - 1], chunks[rng.below(i)]);
  std::vector<int64_t> perm;
  perm.reserve(static_cast<size_t>(n));
  for (size_t g = 0; g < chunks.size(); g += static_cast<size_t>(window)) {
    const size_t begin = perm.size();
    for (size_t k = g; k < std::min(chunks.size(), g + static_cast<size_t>(window)); ++k)
      for (int64_t i = std::max(offset, chunks[k] * chunk);
           i < std::min(offset + n, (chunks[k] + 1) * chunk); ++i)
        perm.push_back(i - offset);
    for (size_t i = perm.size(); i > begin + 1; --i)
      std::swap(perm[i - 1], perm[begin + rng.below(i - begin)]);
  }
  return rank_share(perm, rank, world, skip, block);
}

int64_t auto_workers(int64_t cores, int64_t gpus, int64_t chunks, int64_t local_ranks) {
  int64_t n = std::max<int64_t>(cores, 1);
  if (gpus > 0) n = std::min(n, 4 * gpus);
  if (chunks > 0) n = std::min(n, chunks);
  return std::max<int64_t>(1, n / std::max<int64_t>(1, local_ranks));
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void normalize_u8(
    const uint8_t* src, float* dst, int64_t n, float scale, float shift) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale + shift;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void normalize_f32(
    const float* src, float* dst, int64_t n, float scale, float shift) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale + shift;
}

struct Loader::State {
  struct Slot {
    torch::Tensor x, y, y2;
    double lam = 1.0;
    int64_t turn = 0;    // the next batch number allowed to write this slot
    int64_t ready = -1;  // the batch number now in the slot
    bool free = true;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  std::vector<int64_t> order;
  int64_t next_batch = 0, num_batches = 0;
  int64_t skip = 0;  // of the epoch started last
  bool stop = false;
  std::exception_ptr error;  // the first exception a worker raised; next() rethrows it
  double wait = 0;
  std::atomic<int64_t> aug_ns{0}, aug_samples{0}, fill_cpu_ns{0}, filled_samples{0};
  std::vector<std::thread> threads;
};

Loader::Loader(Dataset ds, LoaderOptions opt)
    : ds_(std::move(ds)), opt_(opt), st_(std::make_shared<State>()) {
  opt_.prefetch = std::max<int64_t>({opt_.prefetch, opt_.workers, 1});
  std::vector<int64_t> shape = {opt_.batch_size};
  shape.insert(shape.end(), ds_.sample_shape.begin(), ds_.sample_shape.end());
  st_->slots.resize(static_cast<size_t>(opt_.prefetch));
  for (auto& s : st_->slots) {
    s.x = compat::host_empty(shape, ds_.token_windows ? torch::kInt64 : torch::kFloat32,
                             opt_.pin_memory);
    if (ds_.token_windows) {
      s.y = compat::host_empty(shape, torch::kInt64, opt_.pin_memory);
    } else if (ds_.float_targets()) {
      std::vector<int64_t> ys = {opt_.batch_size};
      ys.insert(ys.end(), ds_.target_shape.begin(), ds_.target_shape.end());
      s.y = compat::host_empty(ys, torch::kFloat32, opt_.pin_memory);
    } else {
      s.y = compat::host_empty({opt_.batch_size}, torch::kInt64, opt_.pin_memory);
    }
  }
}

Loader::~Loader() { stop_workers(); }

int64_t Loader::samples_per_epoch() const {
  if (opt_.global_block > 0)
    return ds_.count / opt_.global_block * (opt_.global_block / std::max<int64_t>(1, opt_.world));
  if (opt_.world > 1 && opt_.cover_all)  // ranks below the remainder take one more
    return ds_.count / opt_.world + (opt_.rank < ds_.count % opt_.world ? 1 : 0);
  const int64_t per_rank = opt_.world > 1 ? ds_.count / opt_.world : ds_.count;
  return per_rank;
}

int64_t Loader::batches_per_epoch() const { return batches_after(0); }

int64_t Loader::batches_after(int64_t skip) const {
  int64_t n = samples_per_epoch();
  if (opt_.global_block > 0)
    n = (ds_.count - std::min(skip, ds_.count)) / opt_.global_block *
        (opt_.global_block / std::max<int64_t>(1, opt_.world));
  else if (skip > 0 && !(opt_.world > 1 && opt_.cover_all))
    n = (ds_.count - std::min(skip, ds_.count)) / std::max<int64_t>(1, opt_.world);
  return opt_.drop_last ? n / opt_.batch_size : (n + opt_.batch_size - 1) / opt_.batch_size;
}

int64_t Loader::batches_this_epoch() const { return st_->num_batches; }

std::vector<int64_t> Loader::batch_samples(int64_t b) const {
  const auto& order = st_->order;
  const int64_t begin = std::min<int64_t>(b * opt_.batch_size, int64_t(order.size()));
  const int64_t end = std::min<int64_t>(begin + opt_.batch_size, int64_t(order.size()));
  return {order.begin() + begin, order.begin() + end};
}

void Loader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stop = true;
  }
  st_->cv.notify_all();
  for (auto& t : st_->threads) t.join();
  st_->threads.clear();
}

// Token windows: inputs are tokens [iT, iT+T), targets the same shifted by one.
static void fill_windows(const Dataset& ds, const std::vector<int64_t>& order, int64_t begin,
                         int64_t end, int64_t* x, int64_t* y) {
  const int64_t T = ds.sample_shape[0];
  for (int64_t i = begin; i < end; ++i) {
    const int64_t w = order[static_cast<size_t>(i)];
    int64_t* xr = x + (i - begin) * T;
    int64_t* yr = y + (i - begin) * T;
    int64_t prev = ds.token(w, 0);
    for (int64_t j = 0; j < T; ++j) {
      xr[j] = prev;
      yr[j] = prev = ds.token(w, j + 1);
    }
  }
}

// With global blocks (distributed.invariance: bitwise) a sample's augmentation is keyed by its
// place in the epoch's global order and the window's progress by the global batch, so neither
// depends on the rank that reads it, the world, or a resume in between; otherwise the rank's own
// position, as before.
int64_t Loader::epoch_position(int64_t i) const {
  if (opt_.global_block <= 0) return i;
  const int64_t part = opt_.global_block / std::max<int64_t>(1, opt_.world);
  return st_->skip + i / part * opt_.global_block + opt_.rank * part + i % part;
}

int64_t Loader::global_batch(int64_t b) const {
  return opt_.global_block > 0 ? st_->skip / opt_.global_block + b : b;
}

void Loader::fill(int64_t b, torch::Tensor& x, torch::Tensor& y, torch::Tensor& y2, double& lam) {
  const auto& ds = ds_;
  if (ds.token_windows) {
    const int64_t begin = b * opt_.batch_size;
    const int64_t end = std::min<int64_t>(begin + opt_.batch_size, st_->order.size());
    fill_windows(ds, st_->order, begin, end, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    lam = 1.0;
    y2 = torch::Tensor();
    return;
  }
  const auto& opt = opt_;
  const auto& order = st_->order;
  const int64_t begin = b * opt.batch_size;
  const int64_t end = std::min<int64_t>(begin + opt.batch_size, static_cast<int64_t>(order.size()));
  const int64_t elems = ds.sample_elems();
  float* xp = x.data_ptr<float>();
  int64_t* yp = ds.float_targets() ? nullptr : y.data_ptr<int64_t>();
  float* yf = ds.float_targets() ? y.data_ptr<float>() : nullptr;
  const int64_t target_elems = ds.float_targets() ? ds.target_elems() : 0;
  const float inv_std = 1.f / opt.std;
  const size_t bytes = ds.sample_bytes();
  const bool augment = aug_ && aug_->any_sample_op() && ds.sample_shape.size() == 3;
  const double progress = static_cast<double>(epoch_ * batches_per_epoch() + global_batch(b)) /
                          static_cast<double>(total_batches_);
  thread_local std::vector<float> pixels;
  thread_local std::vector<uint8_t> made;  // on-demand samples (image folders, chunk sets)
  double aug_s = 0;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t idx = order[static_cast<size_t>(i)];
    // Samples are random reads from the whole data set: start fetching the next one's cache
    // lines while this one is converted (measured: scripts/bench/train_speed.sh, loader rows).
    if (i + 1 < end && !ds.reader) {
      const char* next =
          reinterpret_cast<const char*>(ds.sample(order[static_cast<size_t>(i + 1)]));
      for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(next + off);
    }
    float* dst = xp + (i - begin) * elems;
    const uint8_t* src = ds.sample_into(idx, made);
    if (augment) {  // pixels in [0, 1] -> augment -> normalise
      pixels.resize(static_cast<size_t>(elems));
      if (ds.dtype == DType::kU8)
        normalize_u8(src, pixels.data(), elems, 1.f / 255.f, 0.f);
      else
        std::memcpy(pixels.data(), src, static_cast<size_t>(elems) * 4);
      const auto ta = std::chrono::steady_clock::now();
      const uint64_t key = static_cast<uint64_t>(epoch_) * static_cast<uint64_t>(ds.count) +
                           static_cast<uint64_t>(epoch_position(i));
      aug_->sample(pixels.data(), ds.sample_shape[0], ds.sample_shape[1], ds.sample_shape[2],
                   progress, key);
      aug_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
      for (int64_t j = 0; j < elems; ++j) dst[j] = (pixels[j] - opt.mean) * inv_std;
    } else if (ds.dtype == DType::kU8) {
      normalize_u8(src, dst, elems, inv_std / 255.f, -opt.mean * inv_std);
    } else {
      normalize_f32(reinterpret_cast<const float*>(src), dst, elems, inv_std, -opt.mean * inv_std);
    }
    if (yf)
      std::memcpy(yf + (i - begin) * target_elems, ds.target(idx),
                  static_cast<size_t>(target_elems) * sizeof(float));
    else
      yp[i - begin] = ds.label(idx);
  }
  lam = 1.0;
  y2 = torch::Tensor();
  if (aug_ && aug_->any_batch_op() && ds.sample_shape.size() == 3) {
    const auto ta = std::chrono::steady_clock::now();
    auto xb = x.narrow(0, 0, end - begin);
    auto m = aug_->batch(xb, y.narrow(0, 0, end - begin), progress,
                         static_cast<uint64_t>(epoch_ * batches_per_epoch() + global_batch(b)));
    if (m.mixed) lam = m.lam, y2 = m.y2;
    aug_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
  }
  if (aug_) {
    st_->aug_ns += static_cast<int64_t>(aug_s * 1e9);
    st_->aug_samples += end - begin;
  }
}

void Loader::set_augmenter(std::shared_ptr<Augmenter> aug, int64_t total_batches) {
  aug_ = std::move(aug);
  total_batches_ = std::max<int64_t>(1, total_batches);
}
static int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// MLTRAIN_TEST_LOADER_DELAY_MS (tests only): every batch also waits this long, as if read from slow
// storage, so a loader is starved by a margin no machine's timing noise hides (profile --fix's
// test: twice the workers then supply about twice the batches). Read once.
static int64_t test_delay_ms() {
  static const int64_t ms = [] {
    const char* v = std::getenv("MLTRAIN_TEST_LOADER_DELAY_MS");
    return v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(0);
  }();
  return ms;
}

// fill() plus the CPU time the calling thread spent in it (loader utilisation for `mltrain profile`).
template <class Slot>
void Loader::timed_fill(int64_t b, Slot& slot) {
  if (const int64_t ms = test_delay_ms(); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  const int64_t c0 = thread_cpu_ns();
  fill(b, slot.x, slot.y, slot.y2, slot.lam);
  st_->fill_cpu_ns += thread_cpu_ns() - c0;
  st_->filled_samples += std::min<int64_t>(
      opt_.batch_size, static_cast<int64_t>(st_->order.size()) - b * opt_.batch_size);
}
double Loader::fill_cpu_seconds() const { return st_->fill_cpu_ns.load() * 1e-9; }
int64_t Loader::filled_samples() const { return st_->filled_samples.load(); }

double Loader::augment_seconds() const { return st_->aug_ns.load() * 1e-9; }
int64_t Loader::augmented_samples() const { return st_->aug_samples.load(); }

void Loader::start_epoch(int64_t epoch, int64_t first_batch, int64_t skip) {
  stop_workers();
  auto& st = *st_;
  st.stop = false;
  st.error = nullptr;
  if (opt_.world > 1 && opt_.cover_all) {
    st.order.clear();
    for (int64_t i = opt_.rank; i < ds_.count; i += opt_.world) st.order.push_back(i);
  } else {
    st.order = !opt_.class_weights.empty()
                   ? weighted_order(ds_, opt_.class_weights, opt_.seed, epoch, opt_.rank,
                                    opt_.world, skip, opt_.global_block)
               : ds_.chunk_samples > 0 && opt_.shuffle
                   ? chunked_order(ds_.count, ds_.reader_offset, ds_.chunk_samples,
                                   std::max<int64_t>(1, opt_.shuffle_window), opt_.seed, epoch,
                                   opt_.rank, opt_.world, skip, opt_.global_block)
                   : epoch_order(ds_.count, opt_.seed, epoch, opt_.rank, opt_.world, opt_.shuffle,
                                 skip, opt_.global_block);
  }
  const int64_t batches = batches_after(skip);
  if (opt_.drop_last) st.order.resize(static_cast<size_t>(batches * opt_.batch_size));
  st.num_batches = batches;
  st.skip = skip;
  epoch_ = epoch;
  st.next_batch = std::min(first_batch, st.num_batches);
  const int64_t P = static_cast<int64_t>(st.slots.size());
  for (int64_t s = 0; s < P; ++s) {
    auto& slot = st.slots[static_cast<size_t>(s)];
    int64_t t =
        st.next_batch + ((s - st.next_batch % P) + P) % P;  // first b >= next_batch with b % P == s
    slot.turn = t;
    slot.ready = -1;
    slot.free = true;
  }
  for (int64_t w = 0; w < opt_.workers; ++w) {
    const int64_t first = st.next_batch;
    st.threads.emplace_back([this, w, first] {
      auto& st = *st_;
      for (int64_t b = first + w; b < st.num_batches; b += opt_.workers) {
        auto& slot = st.slots[static_cast<size_t>(b % static_cast<int64_t>(st.slots.size()))];
        {
          std::unique_lock<std::mutex> lock(st.mu);
          st.cv.wait(lock, [&] { return st.stop || (slot.free && slot.turn == b); });
          if (st.stop) return;
          slot.free = false;
        }
        std::exception_ptr err;
        try {
          timed_fill(b, slot);
        } catch (...) {  // a bad sample (DataError) reaches the training thread, not terminate()
          err = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(st.mu);
          slot.ready = b;
          if (err && !st.error) st.error = err;
        }
        st.cv.notify_all();
        if (err) return;
      }
    });
  }
}

bool Loader::next(Batch& out) {
  out = Batch{};  // releases the previous batch's slot, if the caller passed it back
  auto st_ptr = st_;
  auto& st = *st_;
  const int64_t b = st.next_batch;
  if (b >= st.num_batches) return false;
  const int64_t P = static_cast<int64_t>(st.slots.size());
  auto& slot = st.slots[static_cast<size_t>(b % P)];
  if (opt_.workers == 0) {
    std::unique_lock<std::mutex> lock(st.mu);
    // With no workers the caller fills the slot; it must have released batch b - P first.
    if (!(slot.free && slot.turn == b)) {
      auto t0 = std::chrono::steady_clock::now();
      st.cv.wait(lock, [&] { return slot.free && slot.turn == b; });
      st.wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    slot.free = false;
    lock.unlock();
    auto t0 = std::chrono::steady_clock::now();
    timed_fill(b, slot);
    st.wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slot.ready = b;
  } else {
    std::unique_lock<std::mutex> lock(st.mu);
    if (slot.ready != b) {
      auto t0 = std::chrono::steady_clock::now();
      st.cv.wait(lock, [&] { return slot.ready == b || st.error; });
      st.wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (st.error) std::rethrow_exception(st.error);
  }
  const int64_t size = std::min<int64_t>(
      opt_.batch_size, static_cast<int64_t>(st.order.size()) - b * opt_.batch_size);
  out.x = size == opt_.batch_size ? slot.x : slot.x.narrow(0, 0, size);
  out.y = size == opt_.batch_size ? slot.y : slot.y.narrow(0, 0, size);
  out.index = b;
  out.lam = slot.lam;
  out.y2 = slot.y2.defined() ? slot.y2.narrow(0, 0, size) : slot.y2;
  State::Slot* sp = &slot;
  out.lease = std::shared_ptr<void>(nullptr, [st_ptr, sp, P](void*) {
    {
      std::lock_guard<std::mutex> lock(st_ptr->mu);
      sp->free = true;
      sp->ready = -1;
      sp->turn += P;
    }
    st_ptr->cv.notify_all();
  });
  st.next_batch = b + 1;
  return true;
}

double Loader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->wait;
}

}  // namespace mltrain::data
