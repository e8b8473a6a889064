// safetensors files (checkpoints, `model.init_from`, fuse's output): header length, JSON header,
// buffer. Accepted files must give tensors whose bytes lie inside the file and read back the same
// after a save.
#include "fuzz_support.hpp"
#include "mltrain/formats/safetensors.hpp"

#include <cstring>

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::put("t.safetensors", data, size);
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> meta;
  if (!fuzz::accepts([&] { tensors = formats::load_safetensors(path, &meta); })) return 0;
  size_t total = 0;
  std::vector<std::pair<std::string, torch::Tensor>> list;
  for (auto& [name, t] : tensors) {
    total += t.numel() * t.element_size();
    list.emplace_back(name, t);
  }
  fuzz::require(total <= size, "tensors hold no more bytes than the file");
  const std::string again = (fuzz::scratch() / "again.safetensors").string();
  formats::save_safetensors(again, list, meta);
  auto back = formats::load_safetensors(again);
  fuzz::require(back.size() == tensors.size(), "a saved file holds the same tensors");
  for (auto& [name, t] : tensors)
    fuzz::require(
        back.count(name) && back[name].sizes() == t.sizes() && back[name].dtype() == t.dtype() &&
            std::memcmp(back[name].data_ptr(), t.data_ptr(), t.numel() * t.element_size()) == 0,
        "a saved tensor reads back bit for bit");
  return 0;
}
