#include "mltrain/train/pipeline.hpp"

#include <cstdlib>
#include <filesystem>

#include "mltrain/core/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/data/augment.hpp"
#include "mltrain/task/task.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

// Token streams: root/{train,val}.{bin,npy} unless train_images/test_images name the files.
static void load_token_splits(const config::ExperimentConfig& cfg, Splits& s) {
  const config::DataConfig& c = cfg.data;
  auto pick = [&](const std::string& given, const char* stem) {
    if (!given.empty()) return given;
    const fs::path bin = fs::path(c.root) / (std::string(stem) + ".bin");
    const fs::path npy = fs::path(c.root) / (std::string(stem) + ".npy");
    if (fs::exists(bin) || !fs::exists(npy)) return bin.string();
    return npy.string();
  };
  s.train = data::load_tokens(pick(c.train_images, "train"), cfg.model.block_size, c.vocab_size);
  s.test = data::load_tokens(pick(c.test_images, "val"), cfg.model.block_size,
                             s.train.num_classes);  // one vocabulary for both
}

Splits load_splits(const config::ExperimentConfig& cfg) {
  const config::DataConfig& c = cfg.data;
  std::string tri = c.train_images, trl = c.train_labels, tei = c.test_images, tel = c.test_labels;
  if (c.dataset == "fashion_mnist") {
    const fs::path r = c.root;
    tri = (r / "train-images-idx3-ubyte.gz").string();
    trl = (r / "train-labels-idx1-ubyte.gz").string();
    tei = (r / "t10k-images-idx3-ubyte.gz").string();
    tel = (r / "t10k-labels-idx1-ubyte.gz").string();
    if (!fs::exists(tri))
      throw DataError(
          tri, "Fashion-MNIST not found",
          "run scripts/install-deps.sh (Debian package dataset-fashion-mnist) or set data.root");
  }
  Splits s;
  if (c.dataset == "tokens") {
    load_token_splits(cfg, s);
  } else {
    const data::TargetSpec targets = task::target_spec(cfg);
    s.train = data::load_dataset(tri, trl, targets);
    s.test = data::load_dataset(tei, tel, targets);
  }
  if (s.train.sample_shape != s.test.sample_shape)
    throw DataError(tei, "sample shape differs from the training set's",
                    "pair matching train and test files");
  if (s.train.target_shape != s.test.target_shape ||
      s.train.float_targets() != s.test.float_targets())
    throw DataError(tel, "target shape differs from the training set's",
                    "pair matching train and test target files");
  if (c.limit_train > 0) s.train = s.train.slice(0, c.limit_train);
  if (c.val_fraction > 0) {
    const int64_t nval = static_cast<int64_t>(s.train.count * c.val_fraction);
    s.eval = s.train.slice(s.train.count - nval, s.train.count);
    s.train = s.train.slice(0, s.train.count - nval);
    s.eval_name = "val";
  } else {
    s.eval = s.test;
    s.eval_name = "test";
  }
  return s;
}

int resolve_threads(const config::ExperimentConfig& cfg, const dist::World& world) {
  if (!cfg.runtime.threads.is_auto()) return static_cast<int>(cfg.runtime.threads.resolve(0));
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (const int omp_threads = omp ? std::atoi(omp) : 0; omp_threads > 0) return omp_threads;
  if (world.size > 1) return std::max(1, runtime::usable_cores() / std::max(1, world.local_size));
  return 0;
}

torch::Device prepare_device(const config::ExperimentConfig& cfg, int gpu) {
  if (cfg.runtime.device == "cuda" && !compat::cuda_available())
    throw ConfigError("runtime.device",
                      "cuda asked for, but " +
                          std::string(compat::cuda_built() ? "no CUDA device is visible"
                                                           : "this mltrain was built without CUDA"),
                      "use runtime.device=auto or cpu, or build with -DMLTRAIN_WITH_CUDA=ON "
                      "against a CUDA LibTorch");
  const torch::Device device = compat::resolve_device(cfg.runtime.device, gpu);
  if (device.is_cuda()) {
    if (gpu >= compat::cuda_device_count())
      throw ConfigError(
          "runtime.device",
          "local rank " + std::to_string(gpu) + " needs GPU " + std::to_string(gpu) + ", and " +
              std::to_string(compat::cuda_device_count()) + " are visible",
          "start at most one rank per GPU (--nproc-per-node / --ntasks-per-node), or check "
          "CUDA_VISIBLE_DEVICES");
    compat::set_cuda_device(gpu);
    compat::set_cudnn_benchmark(cfg.runtime.cudnn_benchmark);
  }
  return device;
}

data::LoaderOptions train_loader_options(const config::ExperimentConfig& cfg,
                                         const torch::Device& device) {
  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  lo.workers = cfg.data.workers.resolve(data::auto_workers(runtime::usable_cores()));
  lo.prefetch = cfg.data.prefetch;
  lo.shuffle = cfg.data.shuffle;
  lo.drop_last = cfg.data.drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.mean = static_cast<float>(cfg.data.mean);
  lo.std = static_cast<float>(cfg.data.std);
  lo.pin_memory = device.is_cuda() && cfg.data.pin_memory;
  return lo;
}

data::LoaderOptions plain_loader_options(const config::ExperimentConfig& cfg, int64_t batch_size,
                                         bool shuffle, bool drop_last) {
  data::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.shuffle = shuffle;
  lo.drop_last = drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.mean = static_cast<float>(cfg.data.mean);
  lo.std = static_cast<float>(cfg.data.std);
  return lo;
}

// The run's augmentation, when it has any op, sized to `total_batches` of training.
static void attach_augmenter(const config::ExperimentConfig& cfg, data::Loader& loader,
                             int64_t total_batches) {
  auto aug =
      std::make_shared<data::Augmenter>(cfg.data.augment, static_cast<uint64_t>(cfg.run.seed));
  if (aug->any_sample_op() || aug->any_batch_op()) loader.set_augmenter(aug, total_batches);
}

std::unique_ptr<data::Loader> augmented_loader(const config::ExperimentConfig& cfg,
                                               const data::Dataset& ds,
                                               const data::LoaderOptions& lo) {
  auto loader = std::make_unique<data::Loader>(ds, lo);
  attach_augmenter(cfg, *loader, loader->batches_per_epoch());
  return loader;
}

std::unique_ptr<Pipeline> build_pipeline(const config::ExperimentConfig& config,
                                         const dist::World& world, const PipelineOptions& opt) {
  auto p = std::make_unique<Pipeline>(config);
  const config::ExperimentConfig& cfg = p->cfg;
  const bool distributed = world.size > 1;
  p->world = world;
  runtime::apply({resolve_threads(cfg, world), cfg.runtime.kernel_route, cfg.runtime.allocator});
  p->device = prepare_device(cfg, distributed ? world.local_rank : 0);
  // Data, model and optimizer before anything is written: bad input fails first.
  p->splits = opt.splits ? *opt.splits : load_splits(cfg);
  p->model = model::build_model(cfg.model, p->splits.train.sample_shape,
                                task::model_outputs(cfg, p->splits.train), cfg.run.seed);
  // Commands on a trained run (until kModel) load its checkpoint instead.
  if (!cfg.model.init_from.empty() && opt.until != Stage::kModel) init_from(*p->model, cfg.model);
  p->model->to(p->device);  // before the optimizer takes its parameter list
  if (opt.until == Stage::kModel) return p;

  data::LoaderOptions lo = train_loader_options(cfg, p->device);
  lo.rank = world.rank, lo.world = world.size;  // each rank its shard of one global shuffle
  if (distributed && cfg.data.workers.is_auto()) lo.workers = std::min<int64_t>(lo.workers, 1);
  p->train_loader = std::make_unique<data::Loader>(p->splits.train, lo);
  data::LoaderOptions& eo = p->eval_options;
  eo = lo;
  eo.batch_size = cfg.data.eval_batch_size;
  eo.shuffle = false;
  eo.drop_last = false;
  eo.cover_all = true;  // metrics over every held-out sample, whatever the world size
  eo.workers = std::min<int64_t>(lo.workers, 1);
  const data::Dataset eval =
      opt.eval_limit > 0 ? p->splits.eval.slice(0, std::min(p->splits.eval.count, opt.eval_limit))
                         : p->splits.eval;
  p->eval_loader = std::make_unique<data::Loader>(eval, eo);

  p->optimizer = optim::Optimizer::create(cfg.optim, p->model->named_parameters());
  if (distributed) {
    p->comm = dist::Comm::create(
        world, {cfg.distributed.backend, cfg.distributed.timeout_s, "", p->device});
    p->dp = std::make_unique<dist::DataParallel>(
        *p->comm, p->model->named_parameters(), p->model->named_buffers(),
        static_cast<int64_t>(cfg.distributed.bucket_mb * (1 << 20)), cfg.distributed.overlap,
        cfg.distributed.compress);
    dist::Comm* c = p->comm.get();
    p->optimizer->set_momentum_reducer(
        [c](torch::Tensor& m, torch::Tensor& e) { dist::onebit_average(*c, m, e); });
  }
  p->trainer = std::make_unique<Trainer>(cfg, *p->model, *p->optimizer, *p->train_loader,
                                         *p->eval_loader, Distributed{p->comm.get(), p->dp.get()});
  // Sized from the plan that has the world in it: every micro-batch of the run is one augmenter step.
  attach_augmenter(cfg, *p->train_loader, p->trainer->total_steps() * p->trainer->accumulate());
  return p;
}

}  // namespace mltrain::train
