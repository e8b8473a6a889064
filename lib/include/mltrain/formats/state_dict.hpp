#pragma once
// Reading torch.save(model.state_dict()) archives without Python (init_from.cpp).
#include <torch/torch.h>

#include <map>
#include <string>

namespace mltrain::train {

// Names to tensors; CheckpointError naming the file for anything that is not such an archive.
std::map<std::string, torch::Tensor> read_torch_save(const std::string& path);

}  // namespace mltrain::train
