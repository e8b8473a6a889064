#include "mltrain/optim/optimizer.hpp"

#include <cstring>

#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>

#include <algorithm>
#include <cmath>

#include "mltrain/core/error.hpp"

namespace mltrain::optim {

namespace {

// torch.optim.SGD: d = g + wd*p; buf = m*buf + d (buf = d on the first step);
// d = nesterov ? d + m*buf : buf; p -= lr*d.  (dampening = 0)
class Sgd : public Optimizer {
 public:
  explicit Sgd(config::OptimConfig cfg) : Optimizer(std::move(cfg)) {}
  std::vector<std::string> buffer_names() const override {
    return cfg_.momentum > 0 ? std::vector<std::string>{"momentum_buffer"}
                             : std::vector<std::string>{};
  }
  void update(ParamSlot& s, const torch::Tensor& grad, double lr) override {
    torch::Tensor d = grad;
    if (s.weight_decay != 0) d = d.add(s.param, s.weight_decay);
    if (cfg_.momentum > 0) {
      auto& buf = buffers_[s.name + "/momentum_buffer"];
      if (!buf.defined())
        buf = d.clone();
      else
        buf.mul_(cfg_.momentum).add_(d);
      d = cfg_.nesterov ? d.add(buf, cfg_.momentum) : buf;
    }
    s.param.add_(d, -lr);
  }
};

// torch.optim.Adam / AdamW (single-tensor path, amsgrad off), same operation order so results
// match PyTorch to rounding: m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Adam adds wd*p to g; AdamW scales p by
// (1 - lr*wd) first.
class Adam : public Optimizer {
 public:
  Adam(config::OptimConfig cfg, bool decoupled)
      : Optimizer(std::move(cfg)), decoupled_(decoupled) {}
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(ParamSlot& s, const torch::Tensor& grad, double lr) override {
    auto& m = buffers_[s.name + "/exp_avg"];
    auto& v = buffers_[s.name + "/exp_avg_sq"];
    if (!m.defined()) {
      m = torch::zeros_like(s.param);
      v = torch::zeros_like(s.param);
    }
    const double t = static_cast<double>(steps_ + 1);
    // The fused kernel walks the four tensors' memory as one flat array, so any dense layout
    // they share works: channels-last convolution weights (and their gradients and moments)
    // take it too, as torch.optim.Adam(fused=True) does. Element by element it is the same
    // arithmetic, so the layout does not change a bit of the result (test_engine "[optim]").
    // Equal strides over the dimensions with more than one element: a size-1 dimension's stride
    // never moves through memory, and autograd may give a gradient another one (timm ConvNeXt's
    // depthwise weight [C, 1, 7, 7] has strides (49, 49, 7, 1), its gradient (49, 1, 7, 1)).
    const auto same_dense = [&](const torch::Tensor& x) {
      if (!x.is_non_overlapping_and_dense() || x.sizes() != s.param.sizes()) return false;
      for (int64_t d = 0; d < x.dim(); ++d)  // no allocation: this runs per tensor per step
        if (x.size(d) > 1 && x.stride(d) != s.param.stride(d)) return false;
      return true;
    };
    const bool fusable =
        s.param.device().is_cpu() && same_dense(s.param) && same_dense(grad) && same_dense(m) &&
        same_dense(v) && grad.scalar_type() == s.param.scalar_type() &&
        (s.param.scalar_type() == torch::kFloat || s.param.scalar_type() == torch::kDouble);
    if (fusable) {
      // LibTorch's fused CPU kernel (torch.optim.Adam(fused=True)): one vectorised pass over
      // param, grad and both moments, the step count read from a tensor as PyTorch keeps it.
      // Replaced a hand-fused loop of the same one-pass shape: 1.18x the MLP's training loop
      // (23.3k vs 19.7k samples/s, medians of 5 interleaved rounds, scripts/bench); trajectories
      // still match the torch 2.15 goldens to 1e-12 in float64 (test_engine "[optim]").
      // Flat aliases of the same memory: the kernel copies a gradient that is not contiguous
      // (grad.contiguous()), which for a channels-last weight is a wasted pass per step.
      const auto flat = [](const torch::Tensor& x) { return x.as_strided({x.numel()}, {1}); };
      const auto step = torch::full({}, t, torch::kFloat);
      if (decoupled_)
        at::_fused_adamw_({flat(s.param)}, {flat(grad)}, {flat(m)}, {flat(v)}, {}, {step}, lr,
                          cfg_.beta1, cfg_.beta2, s.weight_decay, cfg_.eps, /*amsgrad=*/false,
                          /*maximize=*/false);
      else
        at::_fused_adam_({flat(s.param)}, {flat(grad)}, {flat(m)}, {flat(v)}, {}, {step}, lr,
                         cfg_.beta1, cfg_.beta2, s.weight_decay, cfg_.eps, /*amsgrad=*/false,
                         /*maximize=*/false);
      return;
    }
    torch::Tensor g = grad;
    if (s.weight_decay != 0) {
      if (decoupled_)
        s.param.mul_(1 - lr * s.weight_decay);
      else
        g = g.add(s.param, s.weight_decay);
    }
    m.mul_(cfg_.beta1).add_(g, 1 - cfg_.beta1);
    v.mul_(cfg_.beta2).addcmul_(g, g.conj(), 1 - cfg_.beta2);
    const double bc1 = 1 - std::pow(cfg_.beta1, t), bc2 = 1 - std::pow(cfg_.beta2, t);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(cfg_.eps);
    s.param.addcdiv_(m, denom, -lr / bc1);
  }

 private:
  bool decoupled_;
};

// 1-bit Adam (Tang et al. 2021; DeepSpeed's OnebitAdam): exact Adam for freeze_step steps (the
// gradients are all-reduced as usual), then the variance is frozen and each rank updates its
// momentum from its own gradient, which is exchanged at 1 bit per element plus a scale per 2048,
// with error feedback; every rank applies the same averaged momentum, so parameters stay equal.
// The compressed average here is exact over all ranks' 1-bit tensors (an all-gather), where
// DeepSpeed adds a second, server-side compression stage for large worlds.
class OneBitAdam : public Optimizer {
 public:
  explicit OneBitAdam(config::OptimConfig cfg) : Optimizer(std::move(cfg)) {}
  std::vector<std::string> buffer_names() const override {
    return {"exp_avg", "exp_avg_sq", "error"};
  }
  bool wants_gradient_sync() const override { return steps_ < cfg_.freeze_step; }
  void set_momentum_reducer(MomentumReducer r) override { reducer_ = std::move(r); }
  // Warm-up: exact Adam, one parameter at a time (the gradients were all-reduced).
  void update(ParamSlot& s, const torch::Tensor& grad, double lr) override {
    auto& m = buffers_[s.name + "/exp_avg"];
    auto& v = buffers_[s.name + "/exp_avg_sq"];
    init(s);
    const double t = static_cast<double>(steps_ + 1);
    const double bc1 = 1 - std::pow(cfg_.beta1, t), bc2 = 1 - std::pow(cfg_.beta2, t);
    torch::Tensor g = grad;
    if (s.weight_decay != 0) g = g.add(s.param, s.weight_decay);
    m.mul_(cfg_.beta1).add_(g, 1 - cfg_.beta1);
    v.mul_(cfg_.beta2).addcmul_(g, g, 1 - cfg_.beta2);
    s.param.addcdiv_(m, (v.sqrt() / std::sqrt(bc2)).add_(cfg_.eps), -lr / bc1);
  }

  // After the freeze: every parameter's momentum in one buffer, one exchange per step (a Gloo
  // collective per tensor cost ~2 ms each on loopback, more than the bytes saved).
  void step(double lr) override {
    if (steps_ < cfg_.freeze_step) return Optimizer::step(lr);
    torch::NoGradGuard ng;
    std::vector<ParamSlot*> live;
    int64_t total = 0;
    for (auto& s : slots_)
      if (s.param.grad().defined()) live.push_back(&s), total += s.param.numel();
    auto u = torch::empty({total}, torch::kFloat), e = torch::empty({total}, torch::kFloat);
    int64_t off = 0;
    for (auto* s : live) {
      init(*s);
      auto& m = buffers_[s->name + "/exp_avg"];
      torch::Tensor g = s->param.grad();
      if (s->weight_decay != 0) g = g.add(s->param, s->weight_decay);
      m.mul_(cfg_.beta1).add_(g, 1 - cfg_.beta1);
      const int64_t n = s->param.numel();
      u.slice(0, off, off + n).copy_((m / denom(*s)).reshape({-1}));
      e.slice(0, off, off + n).copy_(buffers_[s->name + "/error"].reshape({-1}));
      off += n;
    }
    if (reducer_)
      reducer_(u, e);
    else
      onebit_compress(u, e);
    const double bc1 = 1 - std::pow(cfg_.beta1, static_cast<double>(steps_ + 1));
    off = 0;
    for (auto* s : live) {
      const int64_t n = s->param.numel();
      auto& m = buffers_[s->name + "/exp_avg"];
      const auto& d = denom(*s);
      m.copy_(u.slice(0, off, off + n).view(m.sizes()) * d);
      buffers_[s->name + "/error"].copy_(
          e.slice(0, off, off + n).view(buffers_[s->name + "/error"].sizes()));
      s->param.addcdiv_(m, d, -lr * s->lr_mult / bc1);
      off += n;
    }
    ++steps_;
  }

 private:
  void init(const ParamSlot& s) {
    auto& m = buffers_[s.name + "/exp_avg"];
    if (!m.defined())
      m = torch::zeros_like(s.param), buffers_[s.name + "/exp_avg_sq"] = torch::zeros_like(s.param);
    auto& e = buffers_[s.name + "/error"];
    if (!e.defined()) e = torch::zeros({s.param.numel()}, s.param.options());
  }
  // The frozen denominator sqrt(v / (1 - b2^freeze)) + eps, computed once after the freeze (v no
  // longer changes; recomputed after a resume). The frozen variance is zero (or tiny) where a
  // coordinate had no gradient during the warm-up (Fashion-MNIST's always-black border pixels,
  // early-dead ReLUs); when such a coordinate later gets a gradient, lr * m / eps is enormous and
  // the run reached NaN within a few steps even without compression (measured). So it is floored
  // at a tenth of the tensor's mean, the same on every rank because v is. And what is compressed
  // is the preconditioned momentum u = m / denom (DeepSpeed compresses m): averaging u is
  // averaging m, but a 1-bit code gives every element of a chunk the same magnitude, which in
  // m-space lands on those zero-variance coordinates; in u-space no coordinate moves by more
  // than lr * scale, like Adam's own bounded step.
  const torch::Tensor& denom(const ParamSlot& s) {
    auto& d = denom_[s.name];
    if (!d.defined()) {
      const double bc2 = 1 - std::pow(cfg_.beta2, double(cfg_.freeze_step));
      d = (buffers_[s.name + "/exp_avg_sq"].sqrt() / std::sqrt(bc2)).add_(cfg_.eps);
      d = torch::max(d, torch::full_like(d, 0.1 * d.mean().item<double>()));
    }
    return d;
  }
  std::map<std::string, torch::Tensor> denom_;
  MomentumReducer reducer_;
};

}  // namespace

namespace {
constexpr int64_t kOneBitChunk = 2048;  // one scale per 2048 values: 31x fewer bytes than fp32
}

// Plain loops over float32: the tensor-op version (where, expand, bit weights) cost more per step
// than the 2 MB all-reduce it replaces (1-bit Adam ran 2.5x slower than Adam on loopback Gloo).
// CUDA tensors make a round trip through host memory (no CUDA kernel for this yet).
void onebit_compress(torch::Tensor& x, torch::Tensor& error) {
  torch::NoGradGuard ng;
  auto xf = x.reshape({-1}).to(torch::kCPU, torch::kFloat).contiguous();
  auto ef = error.reshape({-1}).to(torch::kCPU, torch::kFloat).contiguous();
  float* xp = xf.data_ptr<float>();
  float* ep = ef.data_ptr<float>();
  const int64_t n = xf.numel();
  for (int64_t c0 = 0; c0 < n; c0 += kOneBitChunk) {
    const int64_t c1 = std::min(n, c0 + kOneBitChunk);
    // Per chunk, the scale that minimises ||c - s sign(c)||^2 is mean |c| (DeepSpeed uses the RMS,
    // which outliers inflate quadratically).
    double sum = 0;
    for (int64_t i = c0; i < c1; ++i) sum += std::fabs(xp[i] + ep[i]);
    const float scale = static_cast<float>(sum / double(c1 - c0));
    for (int64_t i = c0; i < c1; ++i) {
      const float c = xp[i] + ep[i];
      const float q = c >= 0 ? scale : -scale;
      ep[i] = c - q;
      xp[i] = q;
    }
  }
  if (!x.is_same(xf)) x.copy_(xf.view(x.sizes()));
  if (!error.is_same(ef)) error.copy_(ef.view(error.sizes()));
}

torch::Tensor onebit_pack(const torch::Tensor& compressed) {
  const auto c = compressed.reshape({-1}).to(torch::kCPU, torch::kFloat).contiguous();
  const float* cp = c.data_ptr<float>();
  const int64_t n = c.numel(), nb = (n + 7) / 8, chunks = (n + kOneBitChunk - 1) / kOneBitChunk;
  auto out = torch::zeros({nb + 4 * chunks}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    if (cp[i] >= 0) o[i >> 3] = uint8_t(o[i >> 3] | (1u << (i & 7)));
  for (int64_t k = 0; k < chunks; ++k) {  // every |value| in a chunk is its scale
    const float s = std::fabs(cp[k * kOneBitChunk]);
    std::memcpy(o + nb + 4 * k, &s, 4);
  }
  return out;
}

void onebit_unpack_add(const torch::Tensor& packed, int64_t n, float* sum) {
  const int64_t nb = (n + 7) / 8;
  const uint8_t* p = packed.data_ptr<uint8_t>();
  for (int64_t c0 = 0, k = 0; c0 < n; c0 += kOneBitChunk, ++k) {
    float s;
    std::memcpy(&s, p + nb + 4 * k, 4);
    const int64_t c1 = std::min(n, c0 + kOneBitChunk);
    for (int64_t i = c0; i < c1; ++i) sum[i] += (p[i >> 3] >> (i & 7)) & 1 ? s : -s;
  }
}

torch::Tensor onebit_unpack(const torch::Tensor& packed, int64_t n) {
  auto out = torch::zeros({n}, torch::kFloat);
  onebit_unpack_add(packed, n, out.data_ptr<float>());
  return out;
}

double compensated_momentum(double momentum, int64_t batch, int64_t reference) {
  if (reference <= 0 || batch <= 0) return momentum;
  return std::max(0.0, 1.0 - (1.0 - momentum) * std::sqrt(double(reference) / double(batch)));
}

std::unique_ptr<Optimizer> Optimizer::create(const config::OptimConfig& cfg,
                                             const model::NamedTensors& params) {
  std::unique_ptr<Optimizer> opt;
  if (cfg.name == "sgd")
    opt = std::make_unique<Sgd>(cfg);
  else if (cfg.name == "adam")
    opt = std::make_unique<Adam>(cfg, false);
  else if (cfg.name == "adamw")
    opt = std::make_unique<Adam>(cfg, true);
  else if (cfg.name == "onebit_adam")
    opt = std::make_unique<OneBitAdam>(cfg);
  else
    throw ConfigError("optim.name", "unknown optimizer '" + cfg.name + "'",
                      "use sgd, adam, adamw or onebit_adam");
  std::vector<bool> pattern_used(cfg.param_groups.size(), false);
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    ParamSlot s{name, p, 1.0, cfg.weight_decay};
    bool frozen = false;
    for (size_t g = 0; g < cfg.param_groups.size(); ++g) {
      const auto& pg = cfg.param_groups[g];
      if (!glob_match(pg.pattern, name)) continue;
      s.lr_mult = pg.lr_mult;
      if (pg.weight_decay >= 0) s.weight_decay = pg.weight_decay;
      frozen = pg.freeze;
      pattern_used[g] = true;
      break;
    }
    if (frozen) {                // no gradient is computed for it, and it gets no optimizer state
      torch::Tensor shared = p;  // the same tensor
      shared.requires_grad_(false);
      continue;
    }
    opt->slots_.push_back(s);
  }
  for (size_t g = 0; g < pattern_used.size(); ++g)
    if (!pattern_used[g])
      throw ConfigError("optim.param_groups[" + std::to_string(g) + "].pattern",
                        "pattern '" + cfg.param_groups[g].pattern + "' matches no parameter",
                        "parameter names look like conv1.weight, fc2.bias (see the run log)");
  return opt;
}

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const auto& g = s.param.grad();
    if (!g.defined()) continue;
    update(s, g, lr * s.lr_mult);
  }
  ++steps_;
}

void Optimizer::zero_grad() {
  for (auto& s : slots_) s.param.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> Optimizer::buffers_of(const std::string& param_name) {
  std::vector<torch::Tensor> out;
  for (const auto& s : slots_) {
    if (s.name != param_name) continue;
    for (const auto& b : buffer_names()) {
      auto& t = buffers_[s.name + "/" + b];
      if (!t.defined()) t = torch::zeros_like(s.param);
      out.push_back(t);
    }
  }
  return out;
}

model::NamedTensors Optimizer::state() const {
  model::NamedTensors out;
  for (const auto& [k, v] : buffers_) out.emplace_back(k, v);
  out.emplace_back("__step__", torch::tensor({steps_}, torch::kInt64));
  return out;
}

void Optimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  auto it = state.find("__step__");
  if (it == state.end()) throw CheckpointError("optimizer state", "missing __step__");
  steps_ = it->second.item<int64_t>();
  buffers_.clear();
  if (steps_ == 0) return;
  torch::NoGradGuard no_grad;
  for (const auto& s : slots_)
    for (const auto& b : buffer_names()) {
      const std::string key = s.name + "/" + b;
      auto f = state.find(key);
      if (f == state.end())
        throw CheckpointError("optimizer state", "missing buffer '" + key + "'",
                              "the checkpoint was written with another optimizer or model; use "
                              "checkpoint.resume=never");
      if (f->second.sizes() != s.param.sizes())
        throw CheckpointError("optimizer state", "buffer '" + key + "' has the wrong shape");
      // In the parameter's layout (a checkpoint stores it contiguous), so a resumed run takes
      // the same kernels as the uninterrupted one (Adam's fused path needs equal strides).
      buffers_[key] = torch::empty_like(s.param, s.param.options().dtype(f->second.scalar_type()))
                          .copy_(f->second);
    }
}

}  // namespace mltrain::optim
