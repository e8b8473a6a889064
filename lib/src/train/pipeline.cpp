#include "mltrain/train/pipeline.hpp"
#include "mltrain/train/invariant.hpp"
#include "mltrain/dist/pipe_schedule.hpp"

#include "mltrain/runtime/memory.hpp"
#include "mltrain/train/micro_batch.hpp"

#include <cstdlib>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/data/augment.hpp"
#include "mltrain/data/open.hpp"
#include "mltrain/task/task.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

Splits load_splits(const config::ExperimentConfig& cfg) {
  const config::DataConfig& c = cfg.data;
  data::OpenedData d = data::open_data(cfg, task::target_spec(cfg));
  Splits s;
  s.train = std::move(d.train);
  s.test = std::move(d.test);
  s.class_names = std::move(d.class_names);
  s.csv = std::move(d.csv);
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
  // Every world computes a shard with the same threads (kernels may block by thread count).
  if (cfg.distributed.invariance == "bitwise")
    return static_cast<int>(cfg.distributed.invariance_threads);
  if (!cfg.runtime.threads.is_auto()) return static_cast<int>(cfg.runtime.threads.resolve(0));
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (const int omp_threads = omp ? std::atoi(omp) : 0; omp_threads > 0) return omp_threads;
  if (world.size > 1) return std::max(1, runtime::usable_cores() / std::max(1, world.local_size));
  return 0;
}

torch::Device prepare_device(const config::ExperimentConfig& cfg, int gpu) {
  if (cfg.runtime.device == "cuda" && !compat::cuda_available()) {
    std::string why = "no CUDA device is visible";
    if (!compat::cuda_built())
      why = "this mltrain was built without CUDA";
    else if (!compat::cuda_plugin())
      why += ": CUDA libraries " + compat::cuda_plugin_status();
    throw ConfigError("runtime.device", "cuda asked for, but " + why,
                      "use runtime.device=auto or cpu, or build where nvcc of the wheel's CUDA "
                      "major version is on PATH (scripts/build.sh)");
  }
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
                                         const torch::Device& device, const data::Dataset* train,
                                         int local_ranks) {
  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  const int64_t chunks = train && train->chunk_samples > 0
                             ? (train->count + train->chunk_samples - 1) / train->chunk_samples
                             : 0;
  lo.workers = cfg.data.workers.resolve(data::auto_workers(
      runtime::usable_cores(), device.is_cuda() ? compat::cuda_device_count() : 0, chunks,
      std::max(1, local_ranks)));
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
  eo.global_block = 0;  // every held-out sample, not whole global batches (invariance: bitwise)
  eo.workers = std::min<int64_t>(p.train_options.workers, 1);
  return eo;
}

// The micro-batch of the run: memory.micro_batch, or with data.batch_size=auto the probe's.
static int64_t choose_micro_batch(const config::ExperimentConfig& cfg, bool auto_batch,
                                  Pipeline& p) {
  if (cfg.distributed.invariance == "bitwise")  // a virtual shard per forward and backward
    return cfg.train.global_batch / cfg.distributed.virtual_shards;
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
// distributed.pipeline.microbatches: auto, resolved by the bubble formula for the target.
static config::ExperimentConfig resolve_microbatches(config::ExperimentConfig cfg) {
  auto& pp = cfg.distributed.pipeline;
  if (pp.stages <= 1 || !pp.microbatches.is_auto()) return cfg;
  pp.microbatches = dist::microbatches_for_bubble(pp.stages, pp.target_bubble, cfg.data.batch_size);
  spdlog::info(
      "[pipeline] micro-batches auto: {} for {} stages (theoretical bubble {:.1f} %, target "
      "{:.1f} %; 1f1b holds at most {} activations whatever the count)",
      int64_t(pp.microbatches), pp.stages,
      100 * dist::theoretical_bubble(pp.stages, pp.microbatches), 100 * pp.target_bubble,
      pp.stages);
  return cfg;
}

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
  check_invariant_world(config, std::max(1, world.size));
  auto p = std::make_unique<Pipeline>(
      resolve_microbatches(resolve_batch(config, std::max(1, world.size))));
  const config::ExperimentConfig& cfg = p->cfg;
  const bool distributed = world.size > 1;
  p->world = world;
  const int64_t budget = config::memory_budget_bytes(cfg.runtime.memory_budget);
  if (budget > 0) memory::track_cpu();  // before the model, so its weights count
  memory::set_cpu_limit(0);             // a previous pipeline's budget binds nothing here
  runtime::apply({resolve_threads(cfg, world), cfg.runtime.allocator, cfg.runtime.kernel_route});
  p->device = prepare_device(cfg, distributed ? world.local_rank : 0);
  if (cfg.distributed.invariance == "bitwise" && !p->device.is_cpu())
    throw ConfigError("runtime.device",
                      "resolved to " + p->device.str() +
                          "; distributed.invariance=bitwise is built and verified on CPU ranks",
                      "set runtime.device=cpu, or distributed.invariance=none");
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

  // data.workers auto: the node's workers shared among its local ranks.
  data::LoaderOptions lo =
      train_loader_options(cfg, p->device, &p->splits.train, distributed ? world.local_size : 1);
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
    PipelineStages::check(cfg, *p->model, world.size);
    lo.rank = world.rank / int(stages), lo.world = world.size / int(stages);
  }
  if (cfg.distributed.invariance == "bitwise") lo.global_block = cfg.train.global_batch;
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
    p->comm = dist::Comm::create(world,
                                 {cfg.distributed.backend, cfg.distributed.timeout_s, "", p->device,
                                  cfg.distributed.hang_timeout.seconds(), cfg.distributed.doctor});
    const auto bucket = static_cast<int64_t>(cfg.distributed.bucket_mb * (1 << 20));
    if (stages > 1) {
      p->stages = make_stages(cfg, *p);
      if (auto* replicas = p->stages->replica_group())
        p->dp = std::make_unique<dist::DataParallel>(
            *replicas, p->stages->stage_parameters(), p->stages->stage_buffers(), bucket,
            cfg.distributed.overlap, cfg.distributed.compress);
    } else if (cfg.distributed.invariance != "bitwise") {  // else the shards' exact mean
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

LrCurve lr_curve(const config::ExperimentConfig& cfg, int64_t steps) {
  // Epoch-based periods need the epoch length: the loader the run would build knows it.
  const Splits splits = load_splits(cfg);
  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  lo.drop_last = cfg.data.drop_last;
  const data::Loader loader(splits.train, lo);
  const StepPlan plan = plan_steps(cfg, loader.batches_per_epoch(), /*world=*/1);
  LrCurve c;
  c.schedule = cfg.schedule.name;
  c.steps_per_epoch = plan.steps_per_epoch;
  const int64_t n = steps > 0 ? steps : plan.total_steps;
  for (int64_t t = 0; t < n; ++t) c.lr.push_back(plan.lr->lr(t));
  if (cfg.schedule.on_plateau())
    spdlog::warn(
        "[schedule] plateau depends on evaluations; without training it shows the LR "
        "before any drop");
  return c;
}

std::string LrCurve::to_csv() const {
  std::string s = "step,lr\n";
  for (size_t t = 0; t < lr.size(); ++t)
    s += std::to_string(t) + "," + config::format_double(lr[t]) + "\n";
  return s;
}

std::string LrCurve::to_text() const {
  const int64_t n = static_cast<int64_t>(lr.size());
  const int64_t every = std::max<int64_t>(1, n / 20);
  std::string s = "step  lr\n";
  for (int64_t t = 0; t < n; t += every)
    s += std::to_string(t) + "  " + config::format_double(lr[size_t(t)]) + "\n";
  if (n > 0 && (n - 1) % every)
    s += std::to_string(n - 1) + "  " + config::format_double(lr[size_t(n - 1)]) + "\n";
  return s;
}

std::string LrCurve::to_svg() const {
  std::vector<double> xs;
  for (size_t t = 0; t < lr.size(); ++t) xs.push_back(static_cast<double>(t));
  SvgChart chart(schedule + " schedule (" + std::to_string(steps_per_epoch) + " steps/epoch)",
                 "optimizer step", "learning rate");
  chart.add_series(schedule, xs, lr);
  return chart.render();
}

std::vector<std::string> config_notes(const config::ExperimentConfig& cfg) {
  std::vector<std::string> notes = config::recipe_notes(cfg);
  if (!cfg.data.batch_size.is_auto())
    for (const auto& w : memory_warnings(cfg, resolve_accumulate(cfg, 1),
                                         cfg.memory.micro_batch.resolve(cfg.data.batch_size)))
      notes.push_back(w);
  return notes;
}

}  // namespace mltrain::train
