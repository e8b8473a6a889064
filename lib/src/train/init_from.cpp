// model.init_from: start from weights someone else trained — an mltrain run or checkpoint, a
// safetensors file, or a PyTorch state_dict saved with torch.save (read by LibTorch's pickle
// loader; no Python).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "mltrain/core/error.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/train/pipeline.hpp"
#include "mltrain/formats/state_dict.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

namespace {

using Tensors = std::map<std::string, torch::Tensor>;

bool has_safetensors_header(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  char brace = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  in.read(&brace, 1);
  return in.good() && brace == '{' && n > 1 && n < (uint64_t(1) << 30);
}

// The tensors of the newest intact checkpoint of a run, or of one checkpoint folder.
Tensors read_mltrain(const fs::path& p) {
  fs::path dir = p;
  if (!fs::exists(p / "manifest.json")) {
    std::vector<std::string> warnings;
    auto ck = CheckpointStore(p / "checkpoints", {}).load_latest(&warnings);
    for (const auto& w : warnings) spdlog::warn("[init_from] {}", w);
    if (!ck)
      throw CheckpointError((p / "checkpoints").string(), "holds no intact checkpoint",
                            "point model.init_from at a finished run or checkpoint folder");
    dir = ck->dir;
  }
  CheckpointStore::load_dir(dir);  // verifies the manifest's SHA-256s
  return formats::load_safetensors((dir / "model.safetensors").string());
}

Tensors read_weights(const std::string& path) {
  const fs::path p = path;
  if (!fs::exists(p))
    throw ConfigError("model.init_from", "'" + path + "' does not exist",
                      "give a run folder, checkpoint folder, .safetensors or torch.save file");
  if (fs::is_directory(p)) {
    if (!fs::exists(p / "manifest.json") && !fs::exists(p / "checkpoints"))
      throw CheckpointError(path, "is a folder but neither an mltrain run nor a checkpoint",
                            "pass runs/<name>/v<N> or its checkpoints/step_<N>");
    return read_mltrain(p);
  }
  if (has_safetensors_header(p)) return formats::load_safetensors(path);
  return formats::read_torch_save(path);
}

std::string first_names(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

InitReport init_from(model::Model& model, const config::ModelConfig& cfg) {
  Tensors file = read_weights(cfg.init_from);
  // Prefix renames first ('module.=' strips DataParallel's prefix).
  for (const auto& rule : cfg.init_prefix_map) {
    const auto eq = rule.find('=');
    const std::string from = rule.substr(0, eq), to = rule.substr(eq + 1);
    Tensors renamed;
    for (auto& [k, v] : file) renamed[k.rfind(from, 0) == 0 ? to + k.substr(from.size()) : k] = v;
    file = std::move(renamed);
  }
  InitReport r;
  model::NamedTensors targets = model.named_parameters();
  for (auto& b : model.named_buffers()) targets.push_back(b);
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& [name, dst] : targets) {
    auto it = file.find(name);
    if (it == file.end()) {
      r.missing.push_back(name);
      continue;
    }
    used.insert(name);
    if (it->second.sizes() != dst.sizes()) {
      r.mismatched.push_back(name + " (file " + c10::str(it->second.sizes()) + ", model " +
                             c10::str(dst.sizes()) + ")");
      continue;
    }
    dst.copy_(it->second.to(dst.dtype()));
    ++r.loaded;
  }
  for (const auto& [k, v] : file)
    if (!used.count(k)) r.unexpected.push_back(k);
  const bool fits = r.missing.empty() && r.unexpected.empty() && r.mismatched.empty();
  std::string detail;
  if (!r.missing.empty()) detail += "; missing from the file: " + first_names(r.missing);
  if (!r.unexpected.empty()) detail += "; not in the model: " + first_names(r.unexpected);
  if (!r.mismatched.empty()) detail += "; shape differs: " + first_names(r.mismatched);
  if (!fits && cfg.init_strict)
    throw CheckpointError(cfg.init_from, "does not fit the model (strict)" + detail,
                          "set model.init_strict=false to load what fits, or map key prefixes "
                          "with model.init_prefix_map (e.g. 'module.=')");
  spdlog::info("[init_from] {}: {} tensors loaded{}", cfg.init_from, r.loaded, detail);
  return r;
}

}  // namespace mltrain::train
