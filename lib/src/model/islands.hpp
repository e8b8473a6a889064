#pragma once
// fp32 islands (amp.fp32_modules): registry models route each named sub-module call through
// Islands::call, which runs the chosen ones with autocast off and their floating inputs cast to
// fp32 (numerically sensitive layers: norms, softmax heads, the loss-side projection). With no
// island chosen and no recording, a call is one branch.
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "mltrain/runtime/compat.hpp"

namespace mltrain::model {

class Islands {
 public:
  void choose(std::set<std::string> names) { names_ = std::move(names); }
  // Records every wrapped call's output dtype (the fp32-islands test, profile's coverage).
  void record(bool on) {
    recording_ = on;
    outputs_.clear();
  }
  const std::map<std::string, at::ScalarType>& outputs() const { return outputs_; }
  // No island chosen and nothing recorded: call() is f(x), so a model may fuse across modules.
  bool idle() const { return names_.empty() && !recording_; }

  template <class F>
  torch::Tensor call(const std::string& name, const torch::Tensor& x, F&& f) {
    if (names_.empty() && !recording_) return f(x);
    torch::Tensor y;
    if (names_.count(name)) {
      compat::AutocastOff off;
      y = f(x.is_floating_point() && x.scalar_type() != at::kFloat ? x.to(at::kFloat) : x);
    } else {
      y = f(x);
    }
    if (recording_) outputs_[name] = y.scalar_type();
    return y;
  }

 private:
  std::set<std::string> names_;
  bool recording_ = false;
  std::map<std::string, at::ScalarType> outputs_;
};

}  // namespace mltrain::model
