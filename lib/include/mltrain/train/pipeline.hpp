#pragma once
// The seam: the one place a training pipeline is assembled from a config and a world. `train`,
// `profile`, `checklist`, `landscape`, `fuse`/`quantize` (through load_trained_model) and the
// benchmark binary all build through it, so the runtime policy, the device, the splits, the
// loaders, the model, the optimizer, the process group and the step plan cannot differ between
// them. The Trainer is planned once, with its world, and the augmenter sized from that plan.
//
//   auto p = train::build_pipeline(cfg, dist::world_from_env());
//   p->trainer->add_observer(std::make_unique<train::MetricsWriter>(run_dir));
//   p->trainer->fit();
//
//   auto m = train::build_pipeline(cfg, {}, train::model_only());  // runtime, device, splits, model
#include <filesystem>
#include <memory>
#include <string>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/dataset.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/data/sources.hpp"
#include "mltrain/dist/ddp.hpp"
#include "mltrain/dist/world.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/stages.hpp"
#include "mltrain/train/trainer.hpp"

namespace mltrain::train {

struct Splits {
  data::Dataset train, eval, test;
  std::string eval_name;                 // "val" or "test"
  std::vector<std::string> class_names;  // when the data names its classes (data/open.hpp)
  data::CsvOptions::Learned csv;         // a CSV's training table (predict reads inputs by it)
};
// The data set's splits (DataError, exit 3, on a missing or malformed file).
Splits load_splits(const config::ExperimentConfig& cfg);  // targets read for cfg.task

// model.init_from: copies the file's tensors into the model by name (after model.init_prefix_map).
// Strict (model.init_strict): anything missing, unexpected or of another shape is a
// CheckpointError (exit 3) naming the keys; otherwise what fits is loaded and the rest reported.
struct InitReport {
  int64_t loaded = 0;
  std::vector<std::string> missing, unexpected, mismatched;
};
InitReport init_from(model::Model& model, const config::ModelConfig& cfg);

enum class Stage {
  kModel,    // runtime, device, splits and the model on its device: commands on trained weights
  kTrainer,  // and loaders, optimizer, process group (world > 1) and a planned Trainer
};

struct PipelineOptions {
  Stage until = Stage::kTrainer;
  const Splits* splits = nullptr;  // reuse splits already loaded (profile's passes); else cfg.data
  int64_t eval_limit = 0;  // > 0: the eval loader sees only the eval split's first N samples
};
inline PipelineOptions model_only(const Splits* splits = nullptr) {
  PipelineOptions o;
  o.until = Stage::kModel;
  o.splits = splits;
  return o;
}

// Owns every part; members are declared in dependency order, so they are destroyed in reverse
// (the Trainer before the loaders and the model it refers to).
struct Pipeline {
  explicit Pipeline(const config::ExperimentConfig& c) : cfg(c) {}
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  const config::ExperimentConfig cfg;  // the Trainer holds a reference to it
  dist::World world;
  torch::Device device = torch::kCPU;
  Splits splits;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<data::Loader> train_loader, eval_loader;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<dist::Comm> comm;        // world > 1 only
  std::unique_ptr<PipelineStages> stages;  // distributed.pipeline.stages > 1 only
  std::unique_ptr<dist::DataParallel> dp;  // with stages: the stage's replicas (if more than one)
  std::unique_ptr<Trainer> trainer;

  // The loaders' options; eval_options also for a test loader built after training.
  data::LoaderOptions train_options, eval_options;
};

std::unique_ptr<Pipeline> build_pipeline(const config::ExperimentConfig& cfg,
                                         const dist::World& world, const PipelineOptions& opt = {});

// Intra-op threads for this world: runtime.threads when set; else OMP_NUM_THREADS when the
// environment sets it (torchrun sets 1 unless told otherwise), as PyTorch does; else ranks on one
// node split its cores between them; 0 (every core) for a single process.
int resolve_threads(const config::ExperimentConfig& cfg, const dist::World& world);

// runtime.device resolved and checked (ConfigError when cuda is asked for and absent); applies
// runtime.cudnn_benchmark on CUDA. `gpu`: a data-parallel rank's LOCAL_RANK (one GPU per local
// rank, torchrun's and srun's convention).
torch::Device prepare_device(const config::ExperimentConfig& cfg, int gpu = 0);

// The training loader's options from the config (workers `auto` by the field guide's rule over
// this node's cores, the GPUs in use and `train`'s chunks, shared among the node's `local_ranks`;
// pinned memory only on CUDA).
data::LoaderOptions train_loader_options(const config::ExperimentConfig& cfg,
                                         const torch::Device& device,
                                         const data::Dataset* train = nullptr, int local_ranks = 1);

// A loader over `ds` with the training loader's options and the run's augmentation sized to one
// epoch: what `profile` and `checklist` measure the loader's supply rate with.
std::unique_ptr<data::Loader> augmented_loader(const config::ExperimentConfig& cfg,
                                               const data::Dataset& ds,
                                               const data::LoaderOptions& lo);

// A plain loader over real samples for commands that evaluate or calibrate (fuse, quantize,
// landscape): the config's normalisation and seed, no augmentation, no worker threads.
data::LoaderOptions plain_loader_options(const config::ExperimentConfig& cfg, int64_t batch_size,
                                         bool shuffle, bool drop_last);

// A trained model back from disk, for the commands that work on finished runs (landscape, fuse,
// quantize): RUN_DIR (its latest intact checkpoint) or a checkpoint folder; the manifest is
// verified, the model is rebuilt on the CPU through build_pipeline from the run's resolved
// config.yaml and its weights loaded (CheckpointError, exit 3, when anything is missing, damaged or
// of another model). `who` prefixes the warnings about skipped checkpoints.
//
//   auto tm = load_trained_model("runs/cnn/v0", "fuse");   // tm.model in eval mode
struct TrainedModel {
  config::ExperimentConfig cfg;
  std::unique_ptr<model::Model> model;
  std::filesystem::path checkpoint, run_dir;
  Splits splits;
};
TrainedModel load_trained_model(const std::filesystem::path& run_or_checkpoint,
                                const std::string& who);

// `mltrain schedule`: the learning rate at every optimizer step of the run `cfg` describes (one
// rank), with the epoch length its training loader would have; steps 0: train.duration's.
struct LrCurve {
  std::string schedule;
  int64_t steps_per_epoch = 0;
  std::vector<double> lr;       // per optimizer step
  std::string to_csv() const;   // step,lr for every step
  std::string to_text() const;  // about 20 rows and the last step
  std::string to_svg() const;
};
LrCurve lr_curve(const config::ExperimentConfig& cfg, int64_t steps);

// `mltrain config check`: notes on settings that are valid but change what is learnt (the recipe
// notes, and the memory warnings for one rank; an automatic batch size is not probed).
std::vector<std::string> config_notes(const config::ExperimentConfig& cfg);

// A run rebuilt to use its weights (mltrain evaluate, predict): the run's config.yaml with
// `overrides` applied (data.test_images=other/, runtime.device=cpu, ...), the whole pipeline
// (data, model, trainer) as training built it, and one checkpoint restored into it: `where` itself
// when it is a checkpoint folder, else the run's latest intact checkpoint (kLast) or the kept one
// with the best monitored metric (kBest). Evaluating it is what the run's own evaluation did.
enum class Weights { kLast, kBest };
struct RestoredRun {
  std::unique_ptr<Pipeline> pipeline;
  std::filesystem::path run_dir, checkpoint;
  int64_t step = 0;
};
RestoredRun restore_run(const std::filesystem::path& where,
                        const std::vector<std::string>& overrides, Weights which,
                        const std::string& who);

}  // namespace mltrain::train
