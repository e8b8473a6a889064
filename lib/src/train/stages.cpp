#include "mltrain/train/stages.hpp"
#include "mltrain/core/clock.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/model/replay.hpp"
#include "mltrain/train/observers.hpp"
#include "mltrain/train/techniques.hpp"

namespace mltrain::train {

using Clock = std::chrono::steady_clock;
namespace {}  // namespace

// The last stage as a Model for Task::forward: its "forward" runs the stage's units on the
// activation received from the previous stage, so the task computes its loss on the batch's
// targets as it would on the whole model's output.
class StageTail : public model::Model {
 public:
  StageTail(model::Model& m, int64_t begin, int64_t end) : m_(m), begin_(begin), end_(end) {}
  void set_input(torch::Tensor x) { in_ = std::move(x); }
  torch::Tensor forward(const torch::Tensor&) override {
    return m_.forward_units(in_, begin_, end_);
  }
  model::NamedTensors named_parameters() override { return m_.named_parameters(); }
  model::NamedTensors named_buffers() override { return m_.named_buffers(); }
  void set_training(bool on) override { m_.set_training(on); }
  void to(const torch::Device& d) override { m_.to(d); }
  std::string describe() const override { return m_.describe(); }

 private:
  model::Model& m_;
  int64_t begin_, end_;
  torch::Tensor in_;
};

void PipelineStages::check(const config::ExperimentConfig& cfg, const model::Model& model,
                           int64_t world) {
  const int64_t stages = cfg.distributed.pipeline.stages;
  if (world % stages != 0)
    throw ConfigError("distributed.pipeline.stages",
                      std::to_string(stages) + " stages do not divide a world of " +
                          std::to_string(world) + " ranks (world = stages x replicas)",
                      "launch a multiple of " + std::to_string(stages) +
                          " ranks (--nproc-per-node), or set distributed.pipeline.stages to a "
                          "divisor of " +
                          std::to_string(world));
  if (model.num_units() < stages)
    throw ConfigError(
        "distributed.pipeline.stages",
        model.describe() + " has " + std::to_string(model.num_units()) +
            " units (layers or blocks) to cut, fewer than " + std::to_string(stages) + " stages",
        "use at most " + std::to_string(model.num_units()) + " stages, or a deeper model");
}

PipelineStages::PipelineStages(const config::ExperimentConfig& cfg, model::Model& model,
                               dist::Comm& world)
    : cfg_(cfg), model_(model), world_(world) {
  check(cfg, model, world.size());
  stages_ = cfg.distributed.pipeline.stages;
  kind_ = dist::pipe_kind(cfg.distributed.pipeline.schedule);
  replicas_ = world.size() / stages_;
  stage_ = world.rank() % stages_;
  replica_ = world.rank() / stages_;
  std::vector<int> pipe, reps;
  for (int64_t s = 0; s < stages_; ++s) pipe.push_back(int(replica_ * stages_ + s));
  for (int64_t d = 0; d < replicas_; ++d) reps.push_back(int(d * stages_ + stage_));
  pipe_group_ = world.subgroup(pipe, "pipe" + std::to_string(replica_));
  if (replicas_ > 1) replica_group_ = world.subgroup(reps, "stage" + std::to_string(stage_));
}

PipelineStages::~PipelineStages() = default;

int64_t PipelineStages::unit_stage(int64_t unit) const {
  return int64_t(std::upper_bound(bounds_.begin(), bounds_.end(), unit) - bounds_.begin()) - 1;
}

std::vector<int64_t> PipelineStages::act_shape(int64_t boundary, int64_t n) const {
  std::vector<int64_t> s = {n};
  const auto& rest = unit_out_[size_t(boundary - 1)];
  s.insert(s.end(), rest.begin(), rest.end());
  return s;
}

void PipelineStages::balance(const data::Batch& sample, const task::Amp& amp) {
  const int64_t n = model_.num_units();
  std::vector<double> fwd(size_t(n), 1e30), bwd(size_t(n), 1e30);
  unit_out_.assign(size_t(n), {});
  const model::ReplayPoint start(model::buffers_of(model_));
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<torch::Tensor> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
    for (int64_t u = 0; u < n; ++u) {
      torch::Tensor x = u == 0 ? sample.x : outs[size_t(u) - 1].detach().requires_grad_(true);
      ins[size_t(u)] = x;
      const auto t0 = Clock::now();
      {
        compat::AutocastGuard guard(amp.enabled, amp.dtype, amp.cuda);
        outs[size_t(u)] = model_.forward_units(x, u, u + 1);
      }
      fwd[size_t(u)] = std::min(fwd[size_t(u)], seconds_since(t0));
      unit_out_[size_t(u)] = outs[size_t(u)].sizes().slice(1).vec();
    }
    for (int64_t u = n; u-- > 0;) {
      const auto& y = outs[size_t(u)];
      if (!y.requires_grad()) continue;
      const torch::Tensor g = u == n - 1 ? torch::ones_like(y) : ins[size_t(u) + 1].grad();
      if (!g.defined()) continue;
      const auto t0 = Clock::now();
      y.backward(g.to(y.scalar_type()));
      bwd[size_t(u)] = std::min(bwd[size_t(u)], seconds_since(t0));
    }
    for (auto& [name, p] : model_.named_parameters()) p.mutable_grad() = torch::Tensor();
  }
  start.restore();
  for (int64_t u = 0; u < n; ++u) bwd[size_t(u)] = bwd[size_t(u)] > 1e29 ? 0 : bwd[size_t(u)];
  // The same cut on every rank: the ranks' timings summed.
  auto t = torch::zeros({n}, torch::kDouble);
  for (int64_t u = 0; u < n; ++u) t[u] = fwd[size_t(u)] + bwd[size_t(u)];
  std::vector<torch::Tensor> v = {t};
  world_.allreduce_sum(v, "allreduce(pipeline unit times)");
  unit_seconds_.assign(size_t(n), 0);
  for (int64_t u = 0; u < n; ++u)
    unit_seconds_[size_t(u)] = v[0][u].item<double>() / double(world_.size());
  bounds_ = dist::balance_stages(unit_seconds_, stages_);
  tail_ = std::make_unique<StageTail>(model_, bounds_[size_t(stage_)], bounds_[size_t(stage_) + 1]);
  for (auto& [name, p] : model_.named_parameters()) {
    if (owner_stage(name) == stage_) owned_.emplace_back(name, p);
    int64_t users = 0;
    for (int64_t s = 0; s < stages_; ++s) users += uses(name, s) ? 1 : 0;
    if (users > 1) shared_.push_back(p);
  }
  std::string cut;
  for (int64_t s = 0; s < stages_; ++s) {
    double ms = 0;
    for (int64_t u = bounds_[size_t(s)]; u < bounds_[size_t(s) + 1]; ++u)
      ms += 1e3 * unit_seconds_[size_t(u)];
    cut += fmt::format("{}stage {}: units {}..{} ({:.2f} ms)", s ? "; " : "", s, bounds_[size_t(s)],
                       bounds_[size_t(s) + 1] - 1, ms);
  }
  spdlog::info(
      "[pipeline] {} stages x {} replicas, {} micro-batches per batch, {}; {} units cut by "
      "measured forward+backward time: {}",
      stages_, replicas_, cfg_.distributed.pipeline.microbatches,
      cfg_.distributed.pipeline.schedule, n, cut);
}

int64_t PipelineStages::owner_stage(const std::string& name) const {
  return unit_stage(model_.unit_of(name));
}

bool PipelineStages::uses(const std::string& name, int64_t stage) const {
  for (const int64_t u : model_.units_using(name))
    if (unit_stage(u) == stage) return true;
  return false;
}

model::NamedTensors PipelineStages::stage_parameters() {
  model::NamedTensors out;
  for (auto& [name, p] : model_.named_parameters())
    if (uses(name, stage_)) out.emplace_back(name, p);
  return out;
}

model::NamedTensors PipelineStages::stage_buffers() {
  model::NamedTensors out;
  for (auto& [name, b] : model_.named_buffers())
    if (uses(name, stage_)) out.emplace_back(name, b);
  return out;
}

void PipelineStages::sum_shared_gradients() {
  for (auto& p : shared_) {
    torch::Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    std::vector<torch::Tensor> v = {g};
    pipe_group_->allreduce_sum(v, "allreduce(tied weight gradient)");
    if (!p.grad().defined()) p.mutable_grad() = v[0];
  }
}

StageSums PipelineStages::run(const data::Batch& batch, const task::Task& task, double smoothing,
                              double full_window, const task::Amp& amp,
                              const std::function<void()>& before_final_backward) {
  const auto t_run = Clock::now();
  const int64_t n = batch.y.size(0);
  const int64_t per =
      (n + cfg_.distributed.pipeline.microbatches - 1) / cfg_.distributed.pipeline.microbatches;
  const int64_t m = (n + per - 1) / per;  // micro-batches of this batch (fewer when it is short)
  const int64_t b = bounds_[size_t(stage_)], e = bounds_[size_t(stage_) + 1];
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int prev = int(stage_ - 1), next = int(stage_ + 1);  // ranks in the pipeline group
  dist::Comm& pg = *pipe_group_;
  std::vector<torch::Tensor> ins(static_cast<size_t>(m)), outs(static_cast<size_t>(m));
  std::vector<std::shared_ptr<dist::Comm::Pending>> sends;
  StageSums sums;
  const auto ops = dist::pipe_schedule(kind_, stages_, stage_, m);
  double busy = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const int64_t i = ops[k].micro, start = i * per, len = std::min(per, n - start);
    const data::Batch part = batch.rows(start, len);
    if (ops[k].forward) {
      torch::Tensor x;
      if (first) {
        x = part.x;
      } else {
        x = torch::empty(act_shape(b, len), part.y.options().dtype(torch::kFloat32));
        pg.recv(x, prev, int(2 * i), "recv(activation)");
        x.requires_grad_(true);
      }
      ins[size_t(i)] = x;
      const auto t0 = Clock::now();
      if (last) {
        tail_->set_input(x);
        const task::Step out = task.forward(*tail_, part, smoothing, amp);
        tail_->set_input(torch::Tensor());  // the graph keeps what backward needs
        outs[size_t(i)] = out.loss * (double(len) / full_window);
        sums.loss += out.loss.item<double>() * double(len);
        if (out.correct.defined()) {
          sums.counted = true;
          sums.correct += out.correct.item<int64_t>();
          sums.units += out.units;
        }
        busy += seconds_since(t0);
      } else {
        {
          compat::AutocastGuard guard(amp.enabled, amp.dtype, amp.cuda);
          outs[size_t(i)] = model_.forward_units(x, b, e);
        }
        busy += seconds_since(t0);
        sends.push_back(pg.send(outs[size_t(i)].detach().to(torch::kFloat32).contiguous(), next,
                                int(2 * i), "send(activation)"));
      }
      continue;
    }
    // Backward of micro-batch i: the loss on the last stage, else the gradient from the next.
    torch::Tensor g;
    if (!last) {
      g = torch::empty(outs[size_t(i)].sizes(), outs[size_t(i)].options().dtype(torch::kFloat32));
      pg.recv(g, next, int(2 * i + 1), "recv(gradient)");
    }
    if (k + 1 == ops.size() && before_final_backward) before_final_backward();
    const auto t0 = Clock::now();
    const torch::Tensor& y = outs[size_t(i)];
    if (y.requires_grad()) {
      if (last)
        y.backward();
      else
        y.backward(g.to(y.scalar_type()));
    }
    busy += seconds_since(t0);
    if (!first) {
      const torch::Tensor& x = ins[size_t(i)];
      torch::Tensor gx = x.grad().defined() ? x.grad() : torch::zeros_like(x);
      sends.push_back(
          pg.send(gx.to(torch::kFloat32).contiguous(), prev, int(2 * i + 1), "send(gradient)"));
    }
    ins[size_t(i)] = outs[size_t(i)] = torch::Tensor();  // activations freed as soon as done
  }
  for (auto& s : sends) pg.wait(s);
  // The last stage's sums to every stage (the progress line and the metrics are rank 0's).
  std::vector<torch::Tensor> share = {
      torch::tensor({sums.loss, double(sums.correct), double(sums.units), sums.counted ? 1.0 : 0.0},
                    torch::kDouble)};
  pg.broadcast(share, int(stages_ - 1), "broadcast(pipeline loss)");
  sums.loss = share[0][0].item<double>();
  sums.correct = int64_t(share[0][1].item<double>());
  sums.units = int64_t(share[0][2].item<double>());
  sums.counted = share[0][3].item<double>() > 0;
  busy_s_ += busy;
  wall_s_ += seconds_since(t_run);
  batches_ += 1;
  micro_total_ += m;
  return sums;
}

double PipelineStages::global_norm() {
  const double local_norm = grad_norm(owned_);
  std::vector<torch::Tensor> v = {torch::tensor({local_norm * local_norm}, torch::kDouble)};
  pipe_group_->allreduce_sum(v, "allreduce(pipeline gradient norm)");
  return std::sqrt(v[0][0].item<double>());
}

void PipelineStages::gather(optim::Optimizer* opt) {
  torch::NoGradGuard no_grad;
  const auto params = model_.named_parameters(), buffers = model_.named_buffers();
  for (int64_t s = 0; s < stages_; ++s) {
    std::vector<torch::Tensor> mine;  // stage s's tensors, the same list on every rank
    for (const auto* list : {&params, &buffers})
      for (const auto& [name, t] : *list)
        if (owner_stage(name) == s) mine.push_back(t);
    if (opt && opt->steps() > 0)
      for (const auto& [name, t] : params)
        if (owner_stage(name) == s)
          for (auto& buf : opt->buffers_of(name)) mine.push_back(buf);
    if (mine.empty()) continue;
    std::vector<torch::Tensor> flat;
    for (const auto& t : mine) flat.push_back(t.detach().reshape({-1}).to(torch::kDouble));
    std::vector<torch::Tensor> one = {torch::cat(flat)};
    pipe_group_->broadcast(one, int(s), "broadcast(stage state)");
    if (s == stage_) continue;
    int64_t off = 0;
    for (auto& t : mine) {
      t.detach().copy_(one[0].slice(0, off, off + t.numel()).view(t.sizes()).to(t.scalar_type()));
      off += t.numel();
    }
  }
}

void PipelineStages::log_summary() {
  std::vector<torch::Tensor> v = {torch::zeros({2 * stages_}, torch::kDouble)};
  v[0][2 * stage_] = busy_s_;
  v[0][2 * stage_ + 1] = wall_s_;
  pipe_group_->allreduce_sum(v, "allreduce(pipeline bubble)");
  if (batches_ == 0) return;
  double idle = 0, wall = 0;
  std::string per;
  for (int64_t s = 0; s < stages_; ++s) {
    const double busy_s = v[0][2 * s].item<double>(), wall_s = v[0][2 * s + 1].item<double>();
    idle += wall_s - busy_s, wall += wall_s;
    per += fmt::format("{}stage {} {:.1f} %", s ? ", " : "", s,
                       wall_s > 0 ? 100 * (1 - busy_s / wall_s) : 0.0);
  }
  const double mean_m = double(micro_total_) / double(batches_);
  spdlog::info(
      "[pipeline] bubble {:.1f} % measured ({}), {:.1f} % theoretical (S-1)/(M+S-1) for S={} "
      "M={:.3g}; {} schedule, {:.1f} ms per batch",
      wall > 0 ? 100 * idle / wall : 0.0, per,
      100 * dist::theoretical_bubble(stages_, int64_t(std::llround(mean_m))), stages_, mean_m,
      cfg_.distributed.pipeline.schedule, 1e3 * wall_s_ / double(batches_));
}

void StageGather::on_step_end(Trainer& t, const StepInfo&) {
  if (checkpoint_due(t)) p_.gather(&t.optimizer());
}

}  // namespace mltrain::train
