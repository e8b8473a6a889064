#include "mltrain/model/replay.hpp"

#include "mltrain/runtime/compat.hpp"

namespace mltrain::model {

ReplayPoint::ReplayPoint(std::vector<torch::Tensor> buffers)
    : cpu_rng_(compat::cpu_rng_state()),
      cuda_rng_(compat::cuda_rng_state()),
      buffers_(std::move(buffers)) {
  for (const auto& b : buffers_) before_.push_back(b.detach().clone());
}

void ReplayPoint::restore_rng() const {
  compat::set_cpu_rng_state(cpu_rng_);
  compat::set_cuda_rng_state(cuda_rng_);
}

void ReplayPoint::restore_buffers() const {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].detach().copy_(before_[i]);
}

std::vector<torch::Tensor> buffers_of(Model& m) {
  std::vector<torch::Tensor> out;
  for (auto& [n, b] : m.named_buffers()) out.push_back(b);
  return out;
}

}  // namespace mltrain::model
