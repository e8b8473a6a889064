#pragma once
// safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}}, then the raw little-endian buffer. Readable by numpy alone; no code runs on load.
//
//   save_safetensors("model.safetensors", model->named_parameters(), {{"step", "400"}});
//   auto tensors = load_safetensors("model.safetensors");   // name -> tensor (owns its memory)
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mltrain::formats {

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
std::map<std::string, torch::Tensor> load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace mltrain::formats
