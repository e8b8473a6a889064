#include "mltrain/train/micro_batch.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/json.hpp"
#include "mltrain/runtime/memory.hpp"
#include "mltrain/core/sha256.hpp"
#include "mltrain/model/replay.hpp"
#include "mltrain/task/task.hpp"

namespace mltrain::train {
namespace fs = std::filesystem;

int64_t pending_optimizer_bytes(const config::OptimConfig& cfg, model::Model& model,
                                const optim::Optimizer& opt) {
  int64_t params = 0, held = 0;
  for (const auto& [n, p] : model.named_parameters())
    if (p.requires_grad()) params += p.numel() * static_cast<int64_t>(p.element_size());
  for (const auto& [n, t] : opt.state()) held += t.numel() * static_cast<int64_t>(t.element_size());
  const int64_t per_param = cfg.name == "sgd" ? (cfg.momentum > 0 ? 1 : 0) : 2;
  return std::max<int64_t>(0, per_param * params - held);
}

namespace {

fs::path cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "mltrain";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "mltrain";
  return fs::temp_directory_path() / "mltrain-cache";
}

// What decides a step's memory: the resolved config without the run's name and folder, the
// device and the budget.
std::string plan_key(config::ExperimentConfig cfg, const torch::Device& device) {
  cfg.run.name = cfg.run.dir = "";
  cfg.checkpoint.resume = "";
  return sha256_hex(config::to_yaml(cfg) + "|" + device.str() + "|v1");
}

// One forward/backward of the batch's first `m` samples; the peak of tensor memory it reached
// plus the optimizer state still to come. An out-of-memory error counts as "does not fit".
int64_t measure(const task::Task& task, model::Model& model, const data::Batch& full, int64_t m,
                const task::Amp& amp, const torch::Device& device, int64_t pending) {
  data::Batch b = full;
  b.x = full.x.narrow(0, 0, m);
  b.y = full.y.narrow(0, 0, m);
  if (full.y2.defined()) b.y2 = full.y2.narrow(0, 0, m);
  memory::reset_peak(device);
  try {
    task.forward(model, b, 0.0, amp).loss.backward();
  } catch (const std::exception& e) {
    if (!memory::is_out_of_memory(e)) throw;
    return -1;
  }
  if (device.is_cuda()) compat::cuda_synchronize();
  return memory::stats(device).peak + pending;
}

}  // namespace

MicroBatchPlan plan_micro_batch(const config::ExperimentConfig& cfg, model::Model& model,
                                data::Loader& loader, optim::Optimizer& opt,
                                const torch::Device& device,
                                const std::function<int64_t(int64_t)>& extra) {
  MicroBatchPlan plan;
  plan.budget = config::memory_budget_bytes(cfg.runtime.memory_budget);
  if (plan.budget == 0 && device.is_cuda())
    plan.budget = compat::cuda_total_memory(std::max<int>(0, device.index()));
  const int64_t batch = cfg.data.batch_size;
  if (plan.budget == 0) {  // nothing to fit: the whole batch
    plan.micro = batch;
    return plan;
  }
  plan.cache_file = cache_dir() / "micro_batch" / (plan_key(cfg, device) + ".json");
  if (fs::exists(plan.cache_file)) {
    try {
      std::ifstream in(plan.cache_file);
      const auto j = nlohmann::json::parse(in);
      plan.micro = json_int(j.at("micro_batch"));
      plan.peak = json_int(j.at("peak_bytes"));
      if (plan.micro >= 1 && plan.micro <= batch) {
        plan.cached = true;
        return plan;
      }
    } catch (const std::exception& e) {
      spdlog::warn("[memory] {}: unreadable micro-batch cache entry ({}); probing again",
                   plan.cache_file.string(), e.what());
    }
  }

  // One real batch, and everything the probe disturbs, saved to put back.
  loader.start_epoch(0, 0);
  data::Batch full;
  if (!loader.next(full)) throw ConfigError("data.batch_size", "no training batch to probe with");
  full.x = full.x.to(device), full.y = full.y.to(device);
  if (full.y2.defined()) full.y2 = full.y2.to(device);
  const model::ReplayPoint start(model::buffers_of(model));
  const auto task = task::make_task(cfg);
  const task::Amp amp = task::amp_of(cfg.amp, device.is_cuda());
  const int64_t pending = pending_optimizer_bytes(cfg.optim, model, opt);
  model.set_training(true);
  for (int64_t m = batch; m >= 1; m /= 2) {
    int64_t peak = measure(*task, model, full, m, amp, device, pending);
    if (peak >= 0 && extra) peak += extra(m);
    opt.zero_grad();
    plan.measured.emplace_back(m, peak);
    if (peak >= 0 && peak <= plan.budget) {
      plan.micro = m, plan.peak = peak;
      break;
    }
  }
  start.restore();
  full = data::Batch{};  // the loader's slot back before training starts
  loader.start_epoch(0, 0);

  std::string tried;
  for (const auto& [m, peak] : plan.measured)
    tried += (tried.empty() ? "" : ", ") + std::to_string(m) + ": " +
             (peak < 0 ? "out of memory" : memory::mib(peak));
  if (plan.micro == 0)
    throw ConfigError(
        "runtime.memory_budget",
        cfg.runtime.memory_budget + " is smaller than one sample's training step (" + tried + ")",
        "raise runtime.memory_budget above " + memory::mib(plan.measured.back().second) +
            ", or checkpoint activations (memory.checkpoint=blocks)");
  spdlog::info("[memory] micro-batch {} of {} fits {} (step peak {}; probed {})", plan.micro, batch,
               cfg.runtime.memory_budget, memory::mib(plan.peak), tried);
  try {
    fs::create_directories(plan.cache_file.parent_path());
    write_file_atomic(plan.cache_file.string(), nlohmann::json{{"micro_batch", plan.micro},
                                                               {"peak_bytes", plan.peak},
                                                               {"budget_bytes", plan.budget},
                                                               {"device", device.str()}}
                                                    .dump(2));
  } catch (const std::exception& e) {
    spdlog::warn("[memory] could not cache the micro-batch in {}: {}", plan.cache_file.string(),
                 e.what());
  }
  return plan;
}

std::vector<std::string> memory_warnings(const config::ExperimentConfig& cfg, int64_t accumulate,
                                         int64_t micro_batch) {
  std::vector<std::string> out;
  const std::string& m = cfg.model.name;
  const bool has_bn = cfg.model.batchnorm && (m == "cnn" || m == "resnet" || m == "mlp");
  const int64_t batch = cfg.data.batch_size;
  const bool split = micro_batch > 0 && micro_batch < batch;
  if (has_bn && (accumulate > 1 || split)) {
    const int64_t per = split ? micro_batch : batch;
    out.push_back("model.batchnorm: BatchNorm normalises each micro-batch of " +
                  std::to_string(per) + " samples, not the step's " +
                  std::to_string(per * (split ? (batch + per - 1) / per : 1) * accumulate) +
                  ": its statistics are noisier than the effective batch suggests (fix: a larger "
                  "micro-batch with memory.checkpoint=blocks to make room, or a model without "
                  "BatchNorm, e.g. GroupNorm/LayerNorm, or model.batchnorm=false)");
  }
  return out;
}

}  // namespace mltrain::train
