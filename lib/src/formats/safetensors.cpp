#include "mltrain/formats/safetensors.hpp"

#include <cstring>

#include <nlohmann/json.hpp>

#include "mltrain/core/checked.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/json.hpp"

namespace mltrain::formats {
namespace {
const std::vector<std::pair<torch::ScalarType, const char*>> kDtypes = {
    {torch::kFloat32, "F32"},   {torch::kFloat64, "F64"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},     {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"}};
}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // An object even with nothing in it: a default json is `null`, which no reader accepts as a
  // header (the safetensors fuzzer found that a file of zero tensors did not load back).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> bufs;
  uint64_t offset = 0;
  for (const auto& [name, t0] : tensors) {
    auto t = t0.detach().to(torch::kCPU).contiguous();
    const char* dt = nullptr;
    for (auto& [st, n] : kDtypes)
      if (st == t.scalar_type()) dt = n;
    if (!dt)
      throw RuntimeError(path, "cannot store dtype " + std::string(c10::toString(t.scalar_type())) +
                                   " of " + name);
    const uint64_t nbytes = t.numel() * t.element_size();
    header[name] = {
        {"dtype", dt}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    bufs.push_back(t);
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';  // keeps the buffer 8-byte aligned, as the format recommends
  uint64_t hlen = h.size();
  AtomicFile f(path);
  f.write(&hlen, 8);
  f.write(h);
  for (const auto& t : bufs) f.write(t.data_ptr(), t.numel() * t.element_size());
  f.commit();
}

std::map<std::string, torch::Tensor> load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const DataError& e) {
    throw CheckpointError(path, "cannot read: " + e.message());
  }
  if (bytes.size() < 8)
    throw CheckpointError(path, "truncated: shorter than the 8-byte header length");
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > bytes.size() - 8 || hlen > (100u << 20))
    throw CheckpointError(path,
                          "corrupt: header length " + std::to_string(hlen) + " exceeds the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, hlen));
  } catch (const std::exception&) {
    throw CheckpointError(path, "corrupt: the JSON header does not parse");
  }
  if (!header.is_object())
    throw CheckpointError(path, "corrupt: the JSON header is not an object of tensors");
  const uint64_t base = 8 + hlen, data_size = bytes.size() - base;
  std::map<std::string, torch::Tensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    try {
      if (it.key() == "__metadata__") {
        if (metadata)
          for (auto m = it.value().begin(); m != it.value().end(); ++m)
            (*metadata)[m.key()] = m.value().get<std::string>();
        continue;
      }
      const auto dt = it.value().at("dtype").get<std::string>();
      const auto shape = json_ints(it.value().at("shape"));
      const auto offs = json_ints<uint64_t>(it.value().at("data_offsets"));
      torch::ScalarType st = torch::kFloat32;
      bool found = false;
      for (auto& [s, n] : kDtypes)
        if (dt == n) st = s, found = true;
      if (!found)
        throw CheckpointError(path, "tensor '" + it.key() + "' has unsupported dtype " + dt);
      // Sizes are checked against the file before anything is allocated: a corrupt shape must not
      // become a huge (or negative) allocation.
      uint64_t nbytes = 0;
      if (!checked_size(c10::elementSize(st), shape, &nbytes))
        throw CheckpointError(path, "corrupt: tensor '" + it.key() + "' has an impossible shape");
      if (offs.size() != 2 || offs[1] < offs[0] || offs[1] > data_size ||
          offs[1] - offs[0] != nbytes)
        throw CheckpointError(
            path, "corrupt: offsets of '" + it.key() + "' do not fit the file (truncated?)");
      auto t = torch::empty(shape, torch::TensorOptions().dtype(st));
      std::memcpy(t.data_ptr(), bytes.data() + base + offs[0], nbytes);
      out[it.key()] = t;
    } catch (const nlohmann::json::exception&) {
      throw CheckpointError(path, "corrupt: malformed entry for '" + it.key() + "'",
                            "the file is damaged: use another checkpoint");
    }
  }
  return out;
}

}  // namespace mltrain::formats
