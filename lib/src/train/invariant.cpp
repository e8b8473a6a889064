#include "mltrain/train/invariant.hpp"

#include "mltrain/core/error.hpp"
#include "mltrain/core/rng.hpp"
#include "mltrain/dist/ddp.hpp"

namespace mltrain::train {

std::string invariant_worlds(int64_t virtual_shards) {
  std::string s;
  for (int64_t w = 1; w <= virtual_shards; ++w)
    if (virtual_shards % w == 0) s += (s.empty() ? "" : ", ") + std::to_string(w);
  return s;
}

void check_invariant_world(const config::ExperimentConfig& cfg, int64_t world) {
  const int64_t v = cfg.distributed.virtual_shards;
  if (cfg.distributed.invariance != "bitwise" || v % world == 0) return;
  throw ConfigError("distributed.virtual_shards",
                    "a world of " + std::to_string(world) + " ranks does not divide the " +
                        std::to_string(v) + " virtual shards of distributed.invariance=bitwise",
                    "run on one of the worlds " + invariant_worlds(v) +
                        ", or start a new run with a distributed.virtual_shards the world divides");
}

InvariantShards::InvariantShards(const config::ExperimentConfig& cfg, model::Model& model,
                                 dist::Comm* comm)
    : comm_(comm),
      seed_(static_cast<uint64_t>(cfg.run.seed)),
      mean_(cfg.distributed.virtual_shards) {
  const int64_t world = comm ? comm->size() : 1;
  check_invariant_world(cfg, world);
  shards_ = cfg.distributed.virtual_shards;
  shard_ = cfg.train.global_batch / shards_;
  here_ = shards_ / world;
  first_ = (comm ? comm->rank() : 0) * here_;
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad()) params_.emplace_back(name, p);
  for (auto& [name, b] : model.named_buffers()) {
    buffers_.emplace_back(name, b);
    if (b.is_floating_point()) float_buffers_.emplace_back(name, b);
  }
  shards_out_.resize(size_t(here_));
  maxima_.resize(size_t(here_));
}

// The CPU generator keyed by (seed, step, slot): slot s < V before shard s, V after the step.
void InvariantShards::reseed(int64_t step, int64_t slot) const {
  SplitMix mix{seed_ * 0x100000001B3ull ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull +
                                           static_cast<uint64_t>(slot) + 0x1A7B5Dull)};
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix.next());
}

void InvariantShards::run(const data::Batch& batch, int64_t step,
                          const std::function<void(const data::Batch&)>& forward_backward) {
  const int64_t n = batch.y.size(0);
  if (n != here_ * shard_)
    throw RuntimeError("distributed.invariance",
                       "a loader batch of " + std::to_string(n) + " samples where this rank's " +
                           std::to_string(here_) + " shards of " + std::to_string(shard_) +
                           " were expected",
                       "report this as a bug");
  std::vector<torch::Tensor> start;
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, b] : buffers_) start.push_back(b.detach().clone());
  }
  for (int64_t s = 0; s < here_; ++s) {
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(start[i]);
    }
    for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
    // Its own allocation: kernels may take another path for another alignment.
    data::Batch part = batch.rows(s * shard_, shard_);
    part.x = part.x.clone();
    part.y = part.y.clone();
    if (part.y2.defined()) part.y2 = part.y2.clone();
    reseed(step, first_ + s);
    forward_backward(part);
    torch::NoGradGuard no_grad;
    auto& out = shards_out_[size_t(s)];
    out.clear();
    for (auto& [name, p] : params_) {
      const torch::Tensor grad = p.grad();
      out.push_back(grad.defined() ? grad.detach().contiguous().view({-1})
                                   : torch::zeros({p.numel()}, torch::kFloat));
      p.mutable_grad() = torch::Tensor();
    }
    for (auto& [name, t] : float_buffers_) out.push_back(t.detach().reshape({-1}).clone());
    maxima_[size_t(s)] = dist::ExactMean::maxima(out);  // while the backward's output is in cache
  }
  torch::NoGradGuard no_grad;
  // Gradients, and running statistics as the mean of what each shard's forward made of the step's
  // start: one exact mean (each tensor keeps its own grid), one all-gather and one all-reduce.
  const auto mean = mean_.mean(shards_out_, comm_, maxima_);
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].second.mutable_grad() = mean[i].view(params_[i].second.sizes());
  for (size_t i = 0; i < float_buffers_.size(); ++i)
    float_buffers_[i].second.copy_(mean[params_.size() + i].view(float_buffers_[i].second.sizes()));
  for (auto& out : shards_out_) out.clear();  // the gradients' memory goes back before the update
  reseed(step, shards_);
}

}  // namespace mltrain::train
