#pragma once
// Reading torch.save(model.state_dict()) archives without Python (model.init_from).
#include <torch/torch.h>

#include <map>
#include <string>

namespace mltrain::formats {

// Names to tensors; CheckpointError naming the file for anything that is not such an archive.
std::map<std::string, torch::Tensor> read_torch_save(const std::string& path);

}  // namespace mltrain::formats
