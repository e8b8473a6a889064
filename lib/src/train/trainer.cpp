#include "mltrain/train/trainer.hpp"
#include "mltrain/core/clock.hpp"

#include <csignal>

#include "mltrain/dist/ddp.hpp"

#include <spdlog/spdlog.h>

#include <cmath>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"
#include "mltrain/runtime/memory.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/model/replay.hpp"
#include "mltrain/train/invariant.hpp"
#include "mltrain/train/stages.hpp"

namespace mltrain::train {

using Clock = std::chrono::steady_clock;

void PhaseClock::enter(Phase p) {
  if (sync_cuda) compat::cuda_synchronize();
  const auto now = Clock::now();
  const auto i = std::min(static_cast<size_t>(current), kStepPhases - 1);  // outside a step: other
  seconds[i] += std::chrono::duration<double>(now - last).count();
  last = now;
  current = p;
}

void Trainer::enter(Phase p) const {
  if (phases_) phases_->enter(p);
  dist::here::enter(p);
}

double PhaseClock::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

int64_t resolve_accumulate(const config::ExperimentConfig& cfg, int64_t world) {
  const auto& t = cfg.train;
  if (t.global_batch <= 0) return t.accumulate.resolve(1);
  const int64_t per_step = cfg.data.batch_size * world;
  if (t.accumulate.is_auto()) {
    if (t.global_batch % per_step != 0)
      throw ConfigError(
          "train.global_batch",
          std::to_string(t.global_batch) +
              " is not a multiple of data.batch_size x world = " + std::to_string(per_step),
          "pick a global batch divisible by it");
    return t.global_batch / per_step;
  }
  if (t.global_batch != per_step * t.accumulate.value)
    throw ConfigError("train.global_batch",
                      "global_batch " + std::to_string(t.global_batch) + " != data.batch_size " +
                          std::to_string(cfg.data.batch_size) + " x accumulate " +
                          std::to_string(t.accumulate.value) + " x world " + std::to_string(world),
                      "give any two of them: set train.accumulate=auto to derive it");
  return t.accumulate.value;
}

StepPlan plan_steps(const config::ExperimentConfig& cfg, int64_t batches_per_epoch, int64_t world,
                    int64_t total_steps) {
  StepPlan p;
  p.accumulate = resolve_accumulate(cfg, world);
  p.steps_per_epoch = (batches_per_epoch + p.accumulate - 1) / p.accumulate;
  p.total_steps = total_steps >= 0 ? total_steps : cfg.train.duration.to_steps(p.steps_per_epoch);
  // Larger effective batches may take a larger LR: linear (Goyal et al. 2017) or square-root scaling.
  const double k = static_cast<double>(p.accumulate * world);
  const double factor = cfg.train.lr_scaling == "linear" ? k
                        : cfg.train.lr_scaling == "sqrt" ? std::sqrt(k)
                                                         : 1.0;
  p.lr = std::make_unique<optim::Schedule>(cfg.schedule, cfg.optim.lr * factor, p.total_steps,
                                           p.steps_per_epoch);
  return p;
}

Trainer::Trainer(const config::ExperimentConfig& cfg, model::Model& model, optim::Optimizer& opt,
                 data::Loader& train, data::Loader& eval, Distributed distributed)
    : cfg_(cfg),
      model_(model),
      opt_(opt),
      task_(task::make_task(cfg)),
      train_(train),
      eval_(eval),
      comm_(distributed.comm),
      dp_(distributed.dp),
      pipe_(distributed.pipe),
      clipper_(cfg.clip),
      health_(cfg.grad_health),
      early_(cfg.early_stopping) {
  const auto params = model_.named_parameters();
  device_ = params.empty() ? torch::Device(torch::kCPU) : params.front().second.device();
  const int64_t bpe = train_.batches_per_epoch();
  if (bpe == 0)
    throw ConfigError("data.batch_size",
                      "larger than the training set (" +
                          std::to_string(train_.samples_per_epoch()) + " samples): no full batch",
                      "lower data.batch_size");
  // Planned once, with the world: global_batch = batch_size x accumulate x world.
  StepPlan plan = plan_steps(cfg_, bpe, world());
  accumulate_ = plan.accumulate;
  steps_per_epoch_ = plan.steps_per_epoch;
  total_steps_ = plan.total_steps;
  schedule_ = std::move(plan.lr);
  smoothing_ = std::make_unique<optim::Schedule>(
      cfg_.label_smoothing.schedule, cfg_.label_smoothing.value, total_steps_, steps_per_epoch_);
  if (cfg.amp.enabled && cfg.amp.dtype == "fp16") {
    if (!device_.is_cuda())
      throw ConfigError("amp.dtype",
                        "fp16 autocast needs a CUDA device; this run trains on the CPU",
                        "use amp.dtype=bf16 on CPU (AVX-512 BF16 runs it natively), or "
                        "runtime.device=cuda on a GPU");
    scaler_.emplace(cfg.amp);
  }
  if (cfg.ema.enabled) ema_ = std::make_unique<Ema>(cfg.ema, model_);
  if (cfg.distributed.invariance == "bitwise")
    invariant_ = std::make_unique<InvariantShards>(cfg_, model_, comm_);
}

Trainer::~Trainer() = default;

// Host batch -> training device. From pinned slots the copy is asynchronous; the caller fences it
// before the loader may reuse the slot.
void Trainer::to_device(data::Batch& b) const {
  if (device_.is_cpu()) return;
  const bool async = b.x.is_pinned();
  b.x = b.x.to(device_, async);
  b.y = b.y.to(device_, async);
  if (b.y2.defined()) b.y2 = b.y2.to(device_, async);
}

// The next batch on the training device. The fence first waits until the previous batch's async
// copy has read its pinned slot, so the loader may refill it; phases (when profiling) are charged
// with the wait for data and the copy separately.
bool Trainer::next_on_device(data::Loader& loader, data::Batch& b, compat::CopyFence& fence,
                             bool in_step) const {
  fence.wait();
  if (!loader.next(b)) return false;
  if (in_step) enter(Phase::kCopy);
  to_device(b);
  fence.record(device_);
  return true;
}

double EvalResult::metric(const std::string& name, const std::string& key) const {
  if (name == "eval_loss") return loss;
  const auto it = name.rfind("eval_", 0) == 0 ? metrics.find(name.substr(5)) : metrics.end();
  if (it != metrics.end()) return it->second;
  std::string have;
  for (const auto& [k, v] : metrics) have += (have.empty() ? "eval_" : ", eval_") + k;
  throw ConfigError(key, "'" + name + "' is not among this run's metrics: " + have,
                    "monitor one of them");
}

task::Amp Trainer::amp() const { return task::amp_of(cfg_.amp, device_.is_cuda()); }

EvalResult Trainer::evaluate(data::Loader& loader) {
  const auto t0 = Clock::now();
  const bool use_ema = ema_ && cfg_.ema.evaluate;
  if (use_ema) ema_->swap();
  if (pipe_) pipe_->gather();  // every rank evaluates its shard with the whole model
  torch::NoGradGuard no_grad;
  model_.set_training(false);
  auto metrics = task_->accumulator();
  int64_t count = 0;
  loader.start_epoch(0);
  data::Batch b;
  compat::CopyFence fence;
  while (next_on_device(loader, b, fence)) {
    metrics->add(task_->forward(model_, b, 0.0, amp()), b);
    count += b.y.size(0);
    dist::here::tick();  // the doctor: an evaluation batch is progress
  }
  model_.set_training(true);
  if (use_ema) ema_->swap();
  task::Reduce reduce;
  if (comm_ && comm_->size() > 1) {  // each rank evaluated its shard: sum over ranks
    reduce.rank = comm_->rank(), reduce.world = comm_->size();
    reduce.sum = [this](std::vector<torch::Tensor>& t) {
      comm_->allreduce_sum(t, "allreduce(eval metrics)");
    };
    std::vector<torch::Tensor> n = {torch::tensor({double(count)}, torch::kDouble)};
    comm_->allreduce_sum(n, "allreduce(eval count)");
    count = static_cast<int64_t>(n[0][0].item<double>());
  }
  EvalResult r;
  r.metrics = metrics->compute(reduce);
  r.loss = r.metrics.count("loss") ? r.metrics["loss"] : NAN;
  if (r.metrics.count("accuracy")) r.accuracy = r.metrics["accuracy"];
  r.count = count;
  r.seconds = seconds_since(t0);
  eval_seconds_ += r.seconds;
  return r;
}

void Trainer::with_eval_weights(const std::function<void(model::Model&)>& fn) {
  const bool use_ema = ema_ && cfg_.ema.evaluate;
  if (use_ema) ema_->swap();
  if (pipe_) pipe_->gather();
  torch::NoGradGuard no_grad;
  model_.set_training(false);
  try {
    fn(model_);
  } catch (...) {
    model_.set_training(true);
    if (use_ema) ema_->swap();
    throw;
  }
  model_.set_training(true);
  if (use_ema) ema_->swap();
}

void Trainer::predict(data::Loader& loader, const std::function<void(const torch::Tensor&)>& sink) {
  with_eval_weights([&](model::Model& m) {
    loader.start_epoch(0);
    data::Batch b;
    compat::CopyFence fence;
    while (next_on_device(loader, b, fence)) {
      const task::Step s = task_->forward(m, b, 0.0, amp());
      if (!s.output.defined())
        throw ConfigError("task.name",
                          "task " + cfg_.task.name +
                              " computes its loss inside the model and "
                              "returns no outputs to predict from",
                          "export the model (mltrain fuse) and call it directly");
      sink(s.output.detach().to(torch::kCPU, torch::kFloat));
    }
  });
}

void Trainer::set_micro_batch(int64_t samples, bool recover) {
  micro_ = samples >= cfg_.data.batch_size ? 0 : samples;
  oom_recover_ = recover && !(comm_ && comm_->size() > 1) && !invariant_;
}

// acc += x for running sums kept on the device; an undefined acc starts at x, an undefined x adds
// nothing.
static void add_on_device(torch::Tensor& acc, const torch::Tensor& x) {
  if (x.defined()) acc = acc.defined() ? acc + x : x;
}

// The loader batch's micro-batches: forward under autocast, loss in fp32 normalised by the
// samples of the whole accumulation window (so micro-batches of any size add up to the batch's
// gradient), backward. Only the last backward of the window's last batch all-reduces.
Trainer::BatchSums Trainer::forward_backward_once(const data::Batch& batch, double eps,
                                                  double full_window, bool final_micro) {
  BatchSums sums;
  if (pipe_) {  // the batch's micro-batches through the stages
    if (dp_) dp_->broadcast_buffers();
    enter(Phase::kForward);  // forwards and backwards interleave: all of it counts as forward
    const StageSums s = pipe_->run(batch, *task_, eps, full_window, amp(), [&] {
      if (dp_) dp_->begin_backward(final_micro && opt_.wants_gradient_sync());
    });
    return {s.loss, s.correct, s.units, s.counted, {}, {}};
  }
  auto add_step = [&sums](const task::Step& out, int64_t len) {
    // The same double arithmetic as item<double>() * len, on the device (see BatchSums).
    add_on_device(sums.loss_t, out.loss.detach().to(torch::kDouble) * static_cast<double>(len));
    if (out.correct.defined()) {  // train accuracy (tasks that count argmax hits)
      sums.counted = true;
      add_on_device(sums.correct_t, out.correct.detach().to(torch::kLong));
      sums.units += out.units;
    }
  };
  if (invariant_) {  // distributed.invariance: bitwise: each virtual shard on its own
    invariant_->run(batch, progress_.step, [&](const data::Batch& shard) {
      enter(Phase::kForward);
      const task::Step out = task_->forward(model_, shard, eps, amp());
      enter(Phase::kBackward);
      out.loss.backward();
      add_step(out, shard.y.size(0));
      enter(Phase::kAllreduce);  // the shard's gradients kept, then (last shard) the exact mean
    });
    return sums;
  }
  const int64_t n = batch.y.size(0);
  const int64_t m = micro_ > 0 ? micro_ : n;
  for (int64_t start = 0; start < n; start += m) {
    const int64_t len = std::min(m, n - start);
    const data::Batch part = batch.rows(start, len);
    const bool last = start + len >= n;
    if (dp_) dp_->broadcast_buffers();
    enter(Phase::kForward);
    const task::Step out = task_->forward(model_, part, eps, amp());
    auto loss = out.loss * (static_cast<double>(len) / full_window);
    enter(Phase::kBackward);
    // No all-reduce on non-final accumulation micro-steps, nor while the optimizer exchanges
    // momenta instead (1-bit Adam after its warm-up).
    if (dp_) dp_->begin_backward(final_micro && last && opt_.wants_gradient_sync());
    (scaler_ ? scaler_->scale(loss) : loss).backward();
    add_step(out, len);
  }
  return sums;
}

Trainer::BatchSums Trainer::forward_backward(const data::Batch& batch, double eps,
                                             double full_window, bool final_micro) {
  if (!oom_recover_) {
    try {
      return forward_backward_once(batch, eps, full_window, final_micro);
    } catch (const std::exception& e) {
      if (!memory::is_out_of_memory(e)) throw;
      throw RuntimeError("",
                         "out of memory at step " + std::to_string(progress_.step) +
                             " with micro-batches of " +
                             std::to_string(micro_ > 0 ? micro_ : batch.y.size(0)) + ": " +
                             std::string(e.what()).substr(0, 300),
                         "set data.batch_size=auto (with train.global_batch) to fit the memory, "
                         "lower memory.micro_batch, or set memory.checkpoint=blocks");
    }
  }
  // The state the batch starts from, to redo it after an out-of-memory error: RNG (dropout) and
  // buffers (BatchNorm statistics); gradients are zero (the batch is the whole step).
  const model::ReplayPoint start(model::buffers_of(model_));
  while (true) {
    try {
      return forward_backward_once(batch, eps, full_window, final_micro);
    } catch (const std::exception& e) {
      const int64_t now = micro_ > 0 ? micro_ : batch.y.size(0);
      if (!memory::is_out_of_memory(e)) throw;
      if (now <= 1)
        throw RuntimeError(
            "",
            "out of memory at step " + std::to_string(progress_.step) +
                " even with a micro-batch of 1: " + std::string(e.what()).substr(0, 300),
            "raise runtime.memory_budget (what the run holds besides the step: "
            "weights, optimizer state, loader slots, counts), or lower "
            "data.prefetch");
      opt_.zero_grad();
      start.restore();
      micro_ = now / 2;
      ++oom_events_;
      spdlog::warn(
          "[memory] out of memory at step {} with micro-batch {}: redoing the step with {}",
          progress_.step, now, micro_);
    }
  }
}

void Trainer::take_snapshot() {
  torch::NoGradGuard no_grad;
  Snapshot s;
  s.step = opt_.steps();
  for (auto& [n, p] : model_.named_parameters()) s.tensors.push_back(p.detach().clone());
  for (auto& [n, b] : model_.named_buffers()) s.tensors.push_back(b.detach().clone());
  for (auto& [n, t] : opt_.state()) s.optimizer_state.emplace_back(n, t.clone());
  snapshots_.push_back(std::move(s));
  while (snapshots_.size() > 2) snapshots_.pop_front();
}

// Returns whether the optimizer should still step (only for policy warn).
bool Trainer::handle_unhealthy(GradHealth::Verdict v, const model::NamedTensors& params,
                               double norm) {
  const auto& g = cfg_.grad_health;
  std::string what = v == GradHealth::Verdict::kNonFinite
                         ? "non-finite gradient"
                         : "exploding gradient (norm " + std::to_string(norm) + " > " +
                               std::to_string(g.explosion_factor) + " x running mean " +
                               std::to_string(health_.running_mean()) + ")";
  std::string who;
  for (const auto& o : offenders(params)) who += (who.empty() ? "" : "; ") + o;
  spdlog::warn("[grad_health] step {}: {} in {}; policy {}", progress_.step, what, who, g.policy);
  if (g.policy == "warn") return true;
  if (g.policy == "stop") {
    failure_ =
        "gradient health: " + what + " at step " + std::to_string(progress_.step) + " in " + who;
    return false;
  }
  if (g.policy == "rollback") {
    const Snapshot* pick = nullptr;
    for (const auto& s : snapshots_)
      if (opt_.steps() - s.step >= g.rollback_steps) pick = &s;  // newest one old enough
    if (!pick && !snapshots_.empty()) pick = &snapshots_.front();
    if (pick) {
      torch::NoGradGuard no_grad;
      size_t i = 0;
      for (auto& [n, p] : model_.named_parameters()) p.detach().copy_(pick->tensors[i++]);
      for (auto& [n, b] : model_.named_buffers()) b.detach().copy_(pick->tensors[i++]);
      std::map<std::string, torch::Tensor> st(pick->optimizer_state.begin(),
                                              pick->optimizer_state.end());
      opt_.load_state(st);
      progress_.lr_scale *= g.rollback_lr_factor;
      spdlog::warn("[grad_health] rolled back to optimizer step {}; LR now x{}", pick->step,
                   progress_.lr_scale);
    } else {
      spdlog::warn("[grad_health] no snapshot yet: skipping the step instead");
    }
  }
  ++progress_.skipped_steps;
  return false;
}

// Adds a loader batch's sums to the window's (device tensors where the batch kept them).
void Trainer::add_sums(BatchSums& window, const BatchSums& b) {
  window.loss += b.loss;
  window.correct += b.correct;
  window.units += b.units;
  window.counted = window.counted || b.counted;
  add_on_device(window.loss_t, b.loss_t);
  add_on_device(window.correct_t, b.correct_t);
}

// The gradient norm, and the window's device-side loss and hits folded into their host sums, in
// one transfer (on a GPU one synchronisation per step).
double Trainer::read_step_sums(const model::NamedTensors& params, BatchSums& w) {
  const torch::Tensor norm = grad_norm_tensor(params);
  std::vector<torch::Tensor> parts;  // all on the model's device, as doubles
  for (const torch::Tensor& t : {norm, w.loss_t, w.correct_t})
    if (t.defined()) parts.push_back(t.reshape({1}).to(torch::kDouble));
  if (parts.empty()) return 0.0;
  const torch::Tensor host = torch::cat(parts).to(torch::kCPU);
  const double* v = host.data_ptr<double>();
  size_t i = 0;
  const double n = norm.defined() ? v[i++] : 0.0;
  if (w.loss_t.defined()) w.loss += v[i++];
  if (w.correct_t.defined()) w.correct += static_cast<int64_t>(v[i++]);  // exact below 2^53
  w.loss_t = w.correct_t = torch::Tensor();
  return n;
}

// Gradients of the window -> one optimizer update: a short window (the epoch's end) rescaled to
// the full one, fp16 unscaled, the pre-clip norm measured, an overflow or an unhealthy gradient
// handled, then clip, step, EMA and rollback snapshots. Returns whether the update was applied
// (and records it, the LR and the loss scale in info).
bool Trainer::optimizer_step(const model::NamedTensors& params, int64_t window_samples,
                             double full_window, double lr, StepInfo& info, BatchSums& pending) {
  if (pipe_) pipe_->sum_shared_gradients();
  if (window_samples != static_cast<int64_t>(full_window)) {
    torch::NoGradGuard no_grad;
    for (const auto& [n, p] : params)
      if (p.grad().defined()) p.mutable_grad().mul_(full_window / window_samples);
  }
  // Sampled before unscaling: the gradients still carry the scale.
  if (scaler_ && underflow_due()) {
    info.grad_underflow = underflow_share(params, scaler_->value(), /*scaled=*/true);
    if (info.grad_underflow > cfg_.amp.underflow_warn && !underflow_warned_) {
      spdlog::warn(
          "[amp] step {}: {:.1f}% of sampled gradient elements are fp16-subnormal at loss scale "
          "{} (amp.underflow_warn {}): raise amp.init_scale / amp.min_scale, or use "
          "amp.dtype=bf16",
          progress_.step, 100 * info.grad_underflow, scaler_->value(), cfg_.amp.underflow_warn);
      underflow_warned_ = true;
    }
  }
  const bool found_inf = scaler_ ? scaler_->unscale(params) : false;
  info.grad_norm = pipe_ ? pipe_->global_norm() : read_step_sums(params, pending);
  info.loss += pending.loss;
  if (pending.counted) {
    info.correct += pending.correct;
    info.units += pending.units;
    since_eval_correct_ += pending.correct;
    since_eval_count_ += pending.units;
  }
  bool step_now = true;
  if (scaler_ && found_inf) {  // fp16 overflow: normal for a loss scaler, skip and back off
    step_now = false;
    ++progress_.skipped_steps;
  } else if (auto verdict = health_.check(info.grad_norm); verdict != GradHealth::Verdict::kOk) {
    step_now = handle_unhealthy(verdict, params, info.grad_norm);
  }
  schedule_->observe_grad_norm(info.grad_norm);
  if (step_now) {
    clipper_.clip(params, info.grad_norm);
    opt_.step(lr);
    if (ema_) ema_->update();
    if (cfg_.grad_health.policy == "rollback" &&
        opt_.steps() % cfg_.grad_health.rollback_steps == 0)
      take_snapshot();
  }
  if (scaler_) scaler_->update(found_inf);
  opt_.zero_grad();
  info.skipped = !step_now;
  info.lr = lr;
  info.loss_scale = scaler_ ? scaler_->value() : 0;
  return step_now;
}

// fp16's underflow share is sampled on the step the metrics log, the first and every 16th: it
// reads a strided sample of every gradient (about eight small kernels per parameter, a cost the
// GPU's host-bound steps pay in full), and what it watches, the loss scale against the
// gradients' range, moves over many steps.
bool Trainer::underflow_due() const {
  const int64_t next = progress_.step + 1;  // the step this update completes
  return next == 1 || next % 16 == 0 || next == total_steps_ || logs_step(next);
}

bool Trainer::logs_step(int64_t step) const {
  const int64_t every = cfg_.train.log_every.to_steps(steps_per_epoch());
  return every > 0 && (step % every == 0 || step == total_steps_);
}

// The window's last batch is done: progress moves past it, into the next epoch at its end.
void Trainer::advance_progress(int64_t last_batch_index, int64_t batches_per_epoch) {
  progress_.step += 1;
  progress_.batch_in_epoch = last_batch_index + 1;
  if (progress_.batch_in_epoch >= batches_per_epoch) {
    progress_.epoch += 1;
    progress_.batch_in_epoch = 0;
    progress_.epoch_skip = 0;
  }
}

int64_t Trainer::world() const { return pipe_ ? pipe_->replicas() : comm_ ? comm_->size() : 1; }

void Trainer::reshard(int64_t old_world, int64_t old_batch) {
  auto& p = progress_;
  const int64_t consumed = p.epoch_skip + p.batch_in_epoch * old_batch * old_world;
  p.epoch_skip = consumed;
  p.batch_in_epoch = 0;
  const int64_t left = train_.batches_after(consumed);
  const int64_t steps_left = (left + accumulate_ - 1) / accumulate_;
  // An epoch-long duration still ends where it says: this epoch's rest in this world, then whole
  // epochs of this world's steps. A step count stays a step count.
  const auto& d = cfg_.train.duration;
  if (d.unit == config::Period::Unit::kEpochs) {
    const double after = d.value - double(p.epoch + 1);  // epochs after the current one
    int64_t total = p.step + steps_left + std::llround(std::max(0.0, after) * steps_per_epoch_);
    if (after < 0) {  // the run ends inside this epoch: at that share of its samples
      const double n = double(train_.dataset().count);
      const double per_step = double(train_.options().batch_size * world() * accumulate_);
      total = p.step +
              std::max<int64_t>(
                  0, std::llround(((d.value - double(p.epoch)) * n - double(consumed)) / per_step));
    }
    replan(total);
  }
  spdlog::info(
      "[checkpoint] world {} -> {} ranks (batch {} -> {}): epoch {} resumes after {} of its "
      "samples, the other {} re-sharded over {} ranks ({} batches each); the run now ends at "
      "step {}",
      old_world, world(), old_batch, train_.options().batch_size, p.epoch, consumed,
      train_.dataset().count - consumed, world(), left, total_steps_);
}

void Trainer::replan(int64_t total_steps) {
  StepPlan plan = plan_steps(cfg_, train_.batches_per_epoch(), world(), total_steps);
  total_steps_ = plan.total_steps;
  schedule_ = std::move(plan.lr);
  smoothing_ = std::make_unique<optim::Schedule>(
      cfg_.label_smoothing.schedule, cfg_.label_smoothing.value, total_steps_, steps_per_epoch_);
}

void Trainer::start_rewarm(int64_t optimizer_step) {
  if (!cfg_.distributed.rewarm.enabled()) return;
  rewarm_from_ = optimizer_step;
  rewarm_steps_ = cfg_.distributed.rewarm.to_steps(steps_per_epoch_);
  spdlog::info(
      "[train] re-warming the learning rate over {} steps after the restart (distributed.rewarm)",
      rewarm_steps_);
}

// Linear from 1/n at the first step after the resume to 1 after n steps.
double Trainer::rewarm_factor(int64_t optimizer_step) const {
  if (rewarm_from_ < 0 || optimizer_step >= rewarm_from_ + rewarm_steps_) return 1.0;
  return double(std::max<int64_t>(0, optimizer_step - rewarm_from_) + 1) / double(rewarm_steps_);
}

// An evaluation inside fit(): the plateau schedule, time to target, early stopping and adaptive
// augmentation learn from it, then the observers see it.
void Trainer::evaluate_during_fit(double train_loss, double seconds_before,
                                  std::chrono::steady_clock::time_point fit_start) {
  fault::pause("eval");  // the preemption tests signal here, mid-evaluation
  enter(Phase::kEvaluation);
  last_eval_ = evaluate(eval_);
  enter(Phase::kOther);
  if (cfg_.schedule.on_plateau())
    schedule_->observe(opt_.steps(), last_eval_->metric(cfg_.schedule.monitor, "schedule.monitor"));
  if (cfg_.train.target_accuracy > 0 && !progress_.time_to_target &&
      last_eval_->accuracy >= cfg_.train.target_accuracy)
    progress_.time_to_target = seconds_before + seconds_since(fit_start);
  std::map<std::string, double> values = {{"train_loss", train_loss}};
  for (const auto& [k, v] : last_eval_->metrics) values["eval_" + k] = v;
  const std::string why = early_.update(values, progress_.step);
  if (!why.empty()) stop_reason_ = why;
  if (invariant_ && comm_ && comm_->size() > 1) {  // every rank adapts from the same counts
    std::vector<torch::Tensor> c = {
        torch::tensor({double(since_eval_correct_), double(since_eval_count_)}, torch::kDouble)};
    comm_->allreduce_sum(c, "allreduce(train accuracy counts)");
    since_eval_correct_ = static_cast<int64_t>(c[0][0].item<double>());
    since_eval_count_ = static_cast<int64_t>(c[0][1].item<double>());
  }
  if (auto* aug = train_.augmenter(); aug && since_eval_count_ > 0)
    aug->adapt(static_cast<double>(since_eval_correct_) / since_eval_count_, last_eval_->accuracy,
               last_eval_->loss);
  since_eval_correct_ = since_eval_count_ = 0;
  for (auto& o : observers_) o->on_eval_end(*this, *last_eval_);
}

// A stop signal at a step boundary: one rank's signal stops every rank at this same step; the
// observers checkpoint, then Interrupted unwinds fit().
void Trainer::check_stop_signal() {
  int sig = stop_signal();
  if (comm_ && comm_->size() > 1) {
    std::vector<torch::Tensor> s = {torch::tensor({double(sig)}, torch::kDouble)};
    comm_->allreduce_sum(s, "allreduce(stop signal)");
    if (!sig && s[0][0].item<double>() > 0) sig = SIGTERM;
  }
  if (!sig) return;
  for (auto& o : observers_) o->on_stop_request(*this, sig);
  throw Interrupted(sig);
}

void Trainer::fit() {
  const int64_t eval_every = cfg_.train.eval_every.to_steps(steps_per_epoch_);
  const double full_window = static_cast<double>(accumulate_ * cfg_.data.batch_size);
  const auto params = model_.named_parameters();
  const auto fit_start = Clock::now();
  if (std::isnan(fit_start_s_)) fit_start_s_ = runtime::seconds_since_exec();
  const double seconds_before = progress_.train_seconds;
  for (auto& o : observers_) o->on_train_begin(*this);
  model_.set_training(true);
  if (cfg_.grad_health.policy == "rollback" && snapshots_.empty()) take_snapshot();
  fault::pause("fit.begin");  // the preemption tests signal here, before the first step

  while (progress_.step < total_steps_ && stop_reason_.empty() && failure_.empty()) {
    train_.start_epoch(progress_.epoch, progress_.batch_in_epoch, progress_.epoch_skip);
    const int64_t bpe = train_.batches_this_epoch();  // fewer after a resume in another world
    if (bpe == 0) {  // what a resume in another world left of this epoch fills no batch
      progress_.epoch += 1;
      progress_.batch_in_epoch = progress_.epoch_skip = 0;
      continue;
    }
    data::Batch batch;
    StepInfo info;
    BatchSums pending;  // the window's loss and hits so far, read at its optimizer step
    int64_t micro = 0, window_samples = 0;
    double data_s = 0;
    auto t_step = Clock::now(), t_data = Clock::now();
    double blocked_at_step = comm_ ? comm_->blocked_seconds() : 0;
    compat::CopyFence fence;
    while (progress_.step < total_steps_) {
      enter(Phase::kData);  // the doctor: set-up until this process's first step is done
      if (!next_on_device(train_, batch, fence, /*in_step=*/true)) break;
      data_s += seconds_since(t_data);

      // The batch's micro-batches, forward and backward (k micro-batches of b equal one of k*b).
      const double eps = smoothing_->lr(opt_.steps());
      const bool final_micro = micro + 1 >= accumulate_ || batch.index + 1 >= bpe;
      const BatchSums sums = forward_backward(batch, eps, full_window, final_micro);
      const int64_t b = batch.y.size(0);
      if (dp_ && final_micro) {
        enter(Phase::kAllreduce);
        dp_->finish_backward();
      }
      add_sums(pending, sums);
      window_samples += b;
      const bool epoch_end = batch.index + 1 >= bpe;
      if (++micro < accumulate_ && !epoch_end) {
        t_data = Clock::now();
        continue;
      }

      // The optimizer step for the window.
      const double lr = lr_at(opt_.steps());
      enter(Phase::kOptimizer);
      optimizer_step(params, window_samples, full_window, lr, info, pending);
      if (std::isnan(first_step_s_)) {
        first_step_s_ = runtime::seconds_since_exec();
        spdlog::info("[train] first optimizer step done {:.2f} s after exec (set-up {:.2f} s)",
                     first_step_s_, fit_start_s_);
      }

      info.count = window_samples;
      info.micro_batch = micro_ > 0 ? micro_ : static_cast<int64_t>(cfg_.data.batch_size);
      info.loss /= std::max<int64_t>(1, window_samples);
      info.label_smoothing = eps;
      info.data_seconds = data_s;
      info.step_seconds = seconds_since(t_step);
      advance_progress(batch.index, bpe);
      {  // the doctor: this step's time, and the part of it not spent waiting for other ranks
        const double blocked = comm_ ? comm_->blocked_seconds() : 0;
        dist::here::step_done(progress_.step, info.step_seconds,
                              std::max(0.0, info.step_seconds - (blocked - blocked_at_step)));
        enter(Phase::kOther);  // logging, observers, evaluation until the next step's data
      }
      progress_.train_seconds = seconds_before + seconds_since(fit_start);

      if (eval_every > 0 && (progress_.step % eval_every == 0 || progress_.step == total_steps_))
        evaluate_during_fit(info.loss, seconds_before, fit_start);
      for (auto& o : observers_) o->on_step_end(*this, info);

      check_stop_signal();
      if (!stop_reason_.empty() || !failure_.empty()) break;
      info = StepInfo{};
      pending = BatchSums{};
      micro = window_samples = 0;
      data_s = 0;
      t_step = t_data = Clock::now();
      blocked_at_step = comm_ ? comm_->blocked_seconds() : 0;
    }
  }
  progress_.train_seconds = seconds_before + seconds_since(fit_start);
  if (pipe_) pipe_->log_summary();
  if (!stop_reason_.empty()) spdlog::info("[train] stopping early: {}", stop_reason_);
  for (auto& o : observers_) o->on_train_end(*this);  // checkpoints the last healthy weights
  if (!failure_.empty())
    throw RuntimeError("", failure_,
                       "lower optim.lr, enable clip.mode, or use grad_health.policy=rollback");
}

nlohmann::json Trainer::technique_state() const {
  nlohmann::json j = {{"clip", clipper_.state()},
                      {"grad_health", health_.state()},
                      {"early_stopping", early_.state()}};
  if (scaler_) j["loss_scaler"] = scaler_->state();
  if (ema_) j["ema_updates"] = ema_->updates();
  j["schedule_gradnorm"] = schedule_->gradnorm_state();
  if (auto* aug = train_.augmenter()) {
    j["augment_strength"] = aug->strength();
    if (!std::isnan(aug->last_eval_accuracy()))
      j["augment_last_eval_accuracy"] = aug->last_eval_accuracy();
    if (!std::isnan(aug->best_eval_loss())) j["augment_best_eval_loss"] = aug->best_eval_loss();
  }
  j["micro_batch"] = micro_;  // a micro-batch halved after running out of memory stays halved
  j["oom_events"] = oom_events_;
  return j;
}

void Trainer::load_technique_state(const nlohmann::json& j) {
  if (j.contains("clip")) clipper_.load(j["clip"]);
  if (j.contains("grad_health")) health_.load(j["grad_health"]);
  if (j.contains("early_stopping")) early_.load(j["early_stopping"]);
  if (scaler_ && j.contains("loss_scaler")) scaler_->load(j["loss_scaler"]);
  if (ema_ && j.contains("ema_updates")) ema_->set_updates(j["ema_updates"]);
  if (j.contains("schedule_gradnorm")) schedule_->load_gradnorm_state(j["schedule_gradnorm"]);
  if (auto* aug = train_.augmenter(); aug && j.contains("augment_strength"))
    aug->set_strength(j["augment_strength"]);
  if (auto* aug = train_.augmenter(); aug && j.contains("augment_last_eval_accuracy"))
    aug->set_last_eval_accuracy(j["augment_last_eval_accuracy"]);
  if (auto* aug = train_.augmenter(); aug && j.contains("augment_best_eval_loss"))
    aug->set_best_eval_loss(j["augment_best_eval_loss"]);
  if (oom_recover_ && j.contains("micro_batch")) micro_ = j["micro_batch"].get<int64_t>();
  if (j.contains("oom_events")) oom_events_ = j["oom_events"].get<int64_t>();
}

model::NamedTensors Trainer::technique_tensors() const {
  return ema_ ? ema_->state() : model::NamedTensors{};
}

void Trainer::load_technique_tensors(const std::map<std::string, torch::Tensor>& t) {
  if (ema_) ema_->load(t);
}

}  // namespace mltrain::train
