#include "recompute.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/model/replay.hpp"

namespace mltrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the recomputation needs, kept alive by the autograd graph (as a capsule in the context).
struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  ReplayPoint start;  // RNG and buffers before the first forward
  compat::AutocastState cpu_amp, cuda_amp;
  bool input_needs_grad = true;
};

class RecomputeFn : public torch::autograd::Function<RecomputeFn> {
 public:
  // Runs with gradients off (Function::apply sees to that): nothing inside is recorded.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<Segment> seg) {
    torch::Tensor y = seg->fn(x);
    ctx->save_for_backward({x});
    ctx->saved_data["segment"] = c10::IValue::make_capsule(seg);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto seg = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const torch::Tensor saved = ctx->get_saved_variables()[0];
    torch::Tensor x = saved.detach().requires_grad_(true);
    // The same starting point as the first forward: RNG, buffers, autocast.
    const ReplayPoint now = ReplayPoint::rng_now();
    seg->start.restore();
    torch::Tensor y;
    {
      torch::AutoGradMode on(true);
      compat::AutocastGuard cpu_amp(seg->cpu_amp.on, seg->cpu_amp.dtype, /*cuda=*/false);
      compat::AutocastGuard cuda_amp(seg->cuda_amp.on, seg->cuda_amp.dtype, /*cuda=*/true);
      y = seg->fn(x);
    }
    now.restore_rng();
    torch::autograd::backward({y}, {grads[0]});
    return {seg->input_needs_grad ? x.grad() : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor recompute(const torch::Tensor& x, SegmentFn fn, std::vector<torch::Tensor> buffers) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  auto seg = c10::make_intrusive<Segment>();
  seg->fn = std::move(fn);
  // What the first forward starts from, taken just before it runs.
  seg->start = ReplayPoint(std::move(buffers));
  seg->cpu_amp = compat::autocast_state(false);
  seg->cuda_amp = compat::autocast_state(true);
  seg->input_needs_grad = x.requires_grad();
  // The segment's parameters only get gradients through this node, so its input must carry one
  // (a leaf copy when the caller's input does not need a gradient).
  const torch::Tensor in = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return RecomputeFn::apply(in, seg);
}

}  // namespace mltrain::model
