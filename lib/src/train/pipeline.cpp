#include "mltrain/train/pipeline.hpp"

#include "mltrain/core/memory.hpp"
#include "mltrain/train/micro_batch.hpp"

#include <cstdlib>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "mltrain/core/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/data/augment.hpp"
#include "mltrain/data/sources.hpp"
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

// Chunks mapped at once: two shuffle windows (the one being read and the next) plus one per
// worker, unless data.memory_budget_mb caps it.
static data::ChunkReadOptions chunk_options(const config::ExperimentConfig& cfg,
                                            const std::string& dir) {
  data::ChunkReadOptions o;
  const int64_t workers = cfg.data.workers.is_auto() ? 4 : cfg.data.workers.resolve(0);
  o.resident_chunks = 2 * cfg.data.shuffle_window + std::max<int64_t>(workers, 1);
  if (cfg.data.memory_budget_mb > 0) {
    const int64_t bytes = data::chunk_bytes(dir);
    const int64_t fit =
        cfg.data.memory_budget_mb * (int64_t{1} << 20) / std::max<int64_t>(bytes, 1);
    if (fit < cfg.data.shuffle_window + 1)
      throw ConfigError("data.memory_budget_mb",
                        std::to_string(cfg.data.memory_budget_mb) + " MiB holds " +
                            std::to_string(fit) + " chunks of " + std::to_string(bytes >> 20) +
                            " MiB; a shuffle window needs " +
                            std::to_string(cfg.data.shuffle_window + 1),
                        "raise the budget, lower data.shuffle_window, or convert with a smaller "
                        "--chunk-mb");
    o.resident_chunks = std::min(o.resident_chunks, fit);
  }
  return o;
}

// data.format image_folder / csv, or a chunk set by its index.json. False: not one of these.
static bool load_user_splits(const config::ExperimentConfig& cfg, const data::TargetSpec& targets,
                             Splits& s) {
  const config::DataConfig& c = cfg.data;
  if (c.format == "image_folder") {
    data::FolderOptions fo;
    fo.image = {c.image.size, c.image.mode == "rgb" ? 3 : 1, c.image.resize};
    fo.skip_bad = c.on_bad_sample == "skip";
    fo.in_memory = c.image.cache == "memory";
    fo.num_classes = c.num_classes;
    s.train = data::load_image_folder(c.train_images, fo, &fo.classes);
    s.test = data::load_image_folder(c.test_images, fo);
    return true;
  }
  if (c.format == "csv") {
    data::CsvOptions co;
    co.header = c.csv.header;
    co.delimiter = c.csv.delimiter == "\\t" ? '\t' : c.csv.delimiter[0];
    co.features = c.csv.features;
    co.targets = c.csv.target;
    co.categorical = c.csv.categorical;
    co.fill = c.csv.fill;
    co.standardize = c.csv.standardize;
    co.target_kind =
        targets.kind == data::TargetKind::kAuto ? data::TargetKind::kFloat : targets.kind;
    co.num_classes = c.num_classes;
    data::CsvOptions::Learned learned;
    s.train = data::load_csv(c.train_images, co, &learned);
    co.reuse = &learned;
    s.test = data::load_csv(c.test_images, co, nullptr);
    return true;
  }
  if (!data::is_chunk_set(c.train_images)) {
    for (const std::string& f : {c.train_images, c.test_images})
      if (std::filesystem::is_directory(f))
        throw DataError(f,
                        "a folder, but neither a chunk set (no index.json) nor format image_folder",
                        "set data.format=image_folder for a folder of class sub-folders, or "
                        "point at a chunk set from `mltrain data convert`");
    return false;
  }
  s.train = data::load_chunks(c.train_images, chunk_options(cfg, c.train_images));
  if (std::filesystem::is_directory(c.test_images) && !data::is_chunk_set(c.test_images))
    throw DataError(
        c.test_images, "a folder, but not a chunk set (no index.json)",
        "convert the test split too: mltrain data convert " + c.test_images + " -o DIR");
  s.test = data::is_chunk_set(c.test_images)
               ? data::load_chunks(c.test_images, chunk_options(cfg, c.test_images))
               : data::load_dataset(c.test_images, c.test_labels, targets);
  for (const data::Dataset* d : {&s.train, &s.test}) {
    if (d->float_targets() == (targets.kind == data::TargetKind::kClassId))
      throw DataError(d->source,
                      d->float_targets()
                          ? "holds float targets; task " + cfg.task.name + " needs class labels"
                          : "holds class labels; task " + cfg.task.name + " needs float targets",
                      "convert the data with targets matching the task");
    if (!d->float_targets() && d->num_classes > c.num_classes)
      throw DataError(d->source,
                      "labels up to " + std::to_string(d->num_classes) +
                          " classes, data.num_classes is " + std::to_string(c.num_classes),
                      "set data.num_classes=" + std::to_string(d->num_classes));
  }
  return true;
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
  } else if (const data::TargetSpec targets = task::target_spec(cfg);
             !load_user_splits(cfg, targets, s)) {
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
  if (c.folds > 0) {
    if (c.folds > s.train.count)
      throw ConfigError("data.folds",
                        std::to_string(c.folds) + " folds of " + std::to_string(s.train.count) +
                            " training samples leave a fold empty",
                        "use at most " + std::to_string(s.train.count) +
                            " folds (objective.folds in a study), or more data");
    const auto [tr, va] = data::kfold_split(s.train.count, c.folds, c.fold, uint64_t(c.fold_seed));
    s.eval = s.train.gather(va);
    s.train = s.train.gather(tr);
    s.eval_name = "val";
  } else if (c.val_fraction > 0) {
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
                      "use runtime.device=auto or cpu, or build where nvcc of the wheel's CUDA "
                      "major version is on PATH (scripts/build.sh)");
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

// CSV features arrive standardised (data.csv.standardize) or as they are: no pixel scaling.
static void set_normalisation(const config::ExperimentConfig& cfg, data::LoaderOptions& lo) {
  const bool table = cfg.data.format == "csv";
  lo.mean = table ? 0.f : static_cast<float>(cfg.data.mean);
  lo.std = table ? 1.f : static_cast<float>(cfg.data.std);
}

data::LoaderOptions train_loader_options(const config::ExperimentConfig& cfg,
                                         const torch::Device& device, const data::Dataset* train) {
  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  const int64_t chunks = train && train->chunk_samples > 0
                             ? (train->count + train->chunk_samples - 1) / train->chunk_samples
                             : 0;
  lo.workers = cfg.data.workers.resolve(data::auto_workers(
      runtime::usable_cores(), device.is_cuda() ? compat::cuda_device_count() : 0, chunks));
  lo.shuffle_window = cfg.data.shuffle_window;
  lo.prefetch = cfg.data.prefetch;
  lo.shuffle = cfg.data.shuffle;
  lo.drop_last = cfg.data.drop_last;
  lo.seed = static_cast<uint64_t>(cfg.run.seed);
  lo.class_weights = config::sampler_class_weights(cfg);
  set_normalisation(cfg, lo);
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
  lo.shuffle_window = cfg.data.shuffle_window;
  set_normalisation(cfg, lo);
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

// data.batch_size: auto is the whole optimizer step per rank.
static config::ExperimentConfig resolve_batch(config::ExperimentConfig cfg, int64_t world) {
  if (!cfg.data.batch_size.is_auto()) return cfg;
  if (cfg.train.global_batch % world != 0)
    throw ConfigError("train.global_batch",
                      std::to_string(cfg.train.global_batch) + " does not split over " +
                          std::to_string(world) + " ranks",
                      "pick a global batch divisible by the world size");
  cfg.data.batch_size = cfg.train.global_batch / world;
  return cfg;
}

// memory.checkpoint and amp.fp32_modules on the built model (ConfigError, exit 2, when the model
// has no blocks or a pattern matches no module).
static void apply_model_memory(const config::ExperimentConfig& cfg, model::Model& m) {
  const auto& mem = cfg.memory;
  if (mem.checkpoint != "none") {
    const int64_t every = mem.checkpoint == "blocks" ? 1 : mem.checkpoint_every;
    m.set_checkpointing(every);
    spdlog::info("[memory] activation checkpointing: {} blocks in segments of {}", m.num_blocks(),
                 every);
  }
  if (!cfg.amp.fp32_modules.empty()) {
    const auto chosen = m.set_fp32_modules(cfg.amp.fp32_modules);
    std::string list;
    for (const auto& n : chosen) list += (list.empty() ? "" : ", ") + n;
    spdlog::info("[amp] fp32 islands: {}", list);
  }
}

// The evaluation loader's options: the training loader's, unshuffled, every sample, batches no
// larger than a training micro-batch (eval_batch_size auto).
static data::LoaderOptions eval_options_for(const config::ExperimentConfig& cfg, const Pipeline& p,
                                            int64_t micro) {
  data::LoaderOptions eo = p.train_options;
  eo.batch_size = cfg.data.eval_batch_size.resolve(std::min<int64_t>(cfg.data.batch_size, micro));
  eo.shuffle = false;
  eo.drop_last = false;
  eo.cover_all = true;  // metrics over every held-out sample, whatever the world size
  eo.workers = std::min<int64_t>(p.train_options.workers, 1);
  return eo;
}

// The micro-batch of the run: memory.micro_batch, or with data.batch_size=auto the probe's.
static int64_t choose_micro_batch(const config::ExperimentConfig& cfg, bool auto_batch,
                                  Pipeline& p) {
  if (!cfg.memory.micro_batch.is_auto()) return cfg.memory.micro_batch.value;
  if (!auto_batch) return cfg.data.batch_size;
  // The evaluation loader's slots scale with the micro-batch too: measured by building one.
  auto eval_slots = [&](int64_t m) -> int64_t {
    if (!p.device.is_cpu()) return 0;  // host memory, not the GPU's
    data::LoaderOptions eo = eval_options_for(cfg, p, m);
    const int64_t before = memory::stats(p.device).live;
    data::Loader probe(p.splits.eval, eo);
    return memory::stats(p.device).live - before;
  };
  const MicroBatchPlan plan =
      plan_micro_batch(cfg, *p.model, *p.train_loader, *p.optimizer, p.device, eval_slots);
  if (plan.cached)
    spdlog::info("[memory] micro-batch {} of {} (cached in {})", plan.micro,
                 static_cast<int64_t>(cfg.data.batch_size), plan.cache_file.string());
  return plan.micro;
}

// The pipeline stages of this rank, cut by the measured time of each unit on a micro-batch of
// real training samples.
static std::unique_ptr<PipelineStages> make_stages(const config::ExperimentConfig& cfg,
                                                   Pipeline& p) {
  auto stages = std::make_unique<PipelineStages>(cfg, *p.model, *p.comm);
  const int64_t micro = (cfg.data.batch_size + cfg.distributed.pipeline.microbatches - 1) /
                        cfg.distributed.pipeline.microbatches;
  data::Loader probe(p.splits.train, plain_loader_options(cfg, micro, false, true));
  probe.start_epoch(0);
  data::Batch sample;
  probe.next(sample);
  sample.x = sample.x.to(p.device), sample.y = sample.y.to(p.device);
  stages->balance(sample, task::amp_of(cfg.amp, p.device.is_cuda()));
  return stages;
}

std::unique_ptr<Pipeline> build_pipeline(const config::ExperimentConfig& config,
                                         const dist::World& world, const PipelineOptions& opt) {
  const bool auto_batch = config.data.batch_size.is_auto();
  auto p = std::make_unique<Pipeline>(resolve_batch(config, std::max(1, world.size)));
  const config::ExperimentConfig& cfg = p->cfg;
  const bool distributed = world.size > 1;
  p->world = world;
  const int64_t budget = config::memory_budget_bytes(cfg.runtime.memory_budget);
  if (budget > 0) memory::track_cpu();  // before the model, so its weights count
  memory::set_cpu_limit(0);             // a previous pipeline's budget binds nothing here
  runtime::apply({resolve_threads(cfg, world), cfg.runtime.allocator, cfg.runtime.kernel_route});
  p->device = prepare_device(cfg, distributed ? world.local_rank : 0);
  // Data, model and optimizer before anything is written: bad input fails first.
  p->splits = opt.splits ? *opt.splits : load_splits(cfg);
  for (const data::Dataset* d : {&p->splits.train, &p->splits.test})
    if (d->skipped > 0 && !opt.splits)
      spdlog::warn("[data] {}: {} unreadable samples skipped (data.on_bad_sample: skip)", d->source,
                   d->skipped);
  p->model = model::build_model(cfg.model, p->splits.train.sample_shape,
                                task::model_outputs(cfg, p->splits.train), cfg.run.seed);
  // Commands on a trained run (until kModel) load its checkpoint instead.
  if (!cfg.model.init_from.empty() && opt.until != Stage::kModel) init_from(*p->model, cfg.model);
  p->model->to(p->device);  // before the optimizer takes its parameter list
  apply_model_memory(cfg, *p->model);
  if (opt.until == Stage::kModel) return p;

  data::LoaderOptions lo = train_loader_options(cfg, p->device, &p->splits.train);
  lo.rank = world.rank, lo.world = world.size;  // each rank its shard of one global shuffle
  const int64_t stages = cfg.distributed.pipeline.stages;
  if (stages > 1) {  // the stages of one pipeline read the same batches: shards per replica
    if (world.size < stages)
      throw ConfigError("distributed.pipeline.stages",
                        std::to_string(stages) + " stages need " + std::to_string(stages) +
                            " ranks (one per stage), and this run has " +
                            std::to_string(std::max(1, world.size)),
                        "launch it with mltrain launch --nproc-per-node " + std::to_string(stages) +
                            " (or a multiple), or set "
                            "distributed.pipeline.stages=1");
    lo.rank = world.rank / int(stages), lo.world = world.size / int(stages);
  }
  if (distributed && cfg.data.workers.is_auto()) lo.workers = std::min<int64_t>(lo.workers, 1);
  p->train_loader = std::make_unique<data::Loader>(p->splits.train, lo);
  p->train_options = lo;
  config::OptimConfig oc = cfg.optim;
  if (oc.momentum_reference_batch > 0) {
    const int64_t replicas = std::max<int64_t>(1, lo.world);
    const int64_t batch = cfg.data.batch_size * resolve_accumulate(cfg, replicas) * replicas;
    oc.momentum = optim::compensated_momentum(oc.momentum, batch, oc.momentum_reference_batch);
    spdlog::info("[optim] momentum {} -> {:.6g} for a global batch of {} (reference {})",
                 cfg.optim.momentum, oc.momentum, batch, oc.momentum_reference_batch);
  }
  for (const auto& n : config::recipe_notes(cfg)) spdlog::warn("[config] note: {}", n);
  p->optimizer = optim::Optimizer::create(oc, p->model->named_parameters());
  const int64_t micro = choose_micro_batch(cfg, auto_batch, *p);
  p->eval_options = eval_options_for(cfg, *p, micro);
  // Evaluation runs on every rank with the whole model (pipeline stages gather it first).
  p->eval_options.rank = world.rank, p->eval_options.world = std::max(1, world.size);
  const data::LoaderOptions& eo = p->eval_options;
  const data::Dataset eval =
      opt.eval_limit > 0 ? p->splits.eval.slice(0, std::min(p->splits.eval.count, opt.eval_limit))
                         : p->splits.eval;
  p->eval_loader = std::make_unique<data::Loader>(eval, eo);

  if (distributed) {
    p->comm = dist::Comm::create(world, {cfg.distributed.backend, cfg.distributed.timeout_s, "",
                                         p->device, cfg.distributed.hang_timeout.seconds()});
    const auto bucket = static_cast<int64_t>(cfg.distributed.bucket_mb * (1 << 20));
    if (stages > 1) {
      p->stages = make_stages(cfg, *p);
      if (auto* replicas = p->stages->replica_group())
        p->dp = std::make_unique<dist::DataParallel>(
            *replicas, p->stages->stage_parameters(), p->stages->stage_buffers(), bucket,
            cfg.distributed.overlap, cfg.distributed.compress);
    } else {
      p->dp = std::make_unique<dist::DataParallel>(
          *p->comm, p->model->named_parameters(), p->model->named_buffers(), bucket,
          cfg.distributed.overlap, cfg.distributed.compress);
    }
    dist::Comm* c = p->comm.get();
    p->optimizer->set_momentum_reducer(
        [c](torch::Tensor& m, torch::Tensor& e) { dist::onebit_average(*c, m, e); });
  }
  p->trainer =
      std::make_unique<Trainer>(cfg, *p->model, *p->optimizer, *p->train_loader, *p->eval_loader,
                                Distributed{p->comm.get(), p->dp.get(), p->stages.get()});
  p->trainer->set_micro_batch(micro, /*recover=*/auto_batch);
  for (const auto& w : memory_warnings(cfg, p->trainer->accumulate(), micro))
    spdlog::warn("[memory] {}", w);
  // A budget binds the allocator from here on: an out-of-memory error is then what CUDA's would be.
  if (p->device.is_cpu()) memory::set_cpu_limit(budget);
  // Sized from the plan that has the world in it: every micro-batch of the run is one augmenter step.
  attach_augmenter(cfg, *p->train_loader, p->trainer->total_steps() * p->trainer->accumulate());
  return p;
}

}  // namespace mltrain::train
