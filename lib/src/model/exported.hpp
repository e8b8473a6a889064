#pragma once
// model.name: exported — a torch.export program (.pt2) run node by node through the c10
// dispatcher on LibTorch tensors, its parameters leaf tensors that require grad, so autograd
// records the backward as eager PyTorch does. Built by build_model.
#include <memory>
#include <vector>

#include "mltrain/model/model.hpp"

namespace mltrain::model {

std::unique_ptr<Model> make_exported(const config::ModelConfig& c,
                                     const std::vector<int64_t>& sample_shape);

}  // namespace mltrain::model
