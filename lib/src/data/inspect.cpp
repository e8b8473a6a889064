// `mltrain data inspect`: what a data file or chunk set holds, as text.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/data/sources.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

namespace {

std::string dims_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + "]";
}

// Label counts, or the float targets' shape; pixel statistics of u8 samples held in memory.
void describe_samples(const Dataset& ds, std::ostream& o) {
  if (ds.float_targets()) {
    o << "targets: float, " << dims_text(ds.target_shape) << " per sample\n";
  } else if (ds.labels && !ds.labels->empty()) {
    std::map<int64_t, int64_t> hist;
    for (int64_t i = 0; i < ds.count; ++i) hist[ds.label(i)]++;
    o << "labels:";
    for (auto& [k, v] : hist) o << " " << k << ":" << v;
    o << "\n";
  }
  if (ds.dtype == DType::kU8 && ds.count > 0 && ds.data) {
    double s = 0, s2 = 0;
    const int64_t n = ds.count * ds.sample_elems();
    for (int64_t i = 0; i < n; ++i) {
      const double v = ds.data[i] / 255.0;
      s += v, s2 += v * v;
    }
    const double mean = s / n;
    o << "pixels/255: mean " << mean << " std " << std::sqrt(s2 / n - mean * mean) << "\n";
  }
}

std::string inspect_chunks(const std::string& dir) {
  ChunkReadOptions ro;
  ro.resident_chunks = 1, ro.verify = false;  // counts and labels only: no chunk is read
  const Dataset ds = load_chunks(dir, ro);
  std::ifstream in(fs::path(dir) / "index.json");
  const auto index = nlohmann::json::parse(in, nullptr, false);
  std::ostringstream o;
  o << dir << ": chunk set, " << ds.count << " samples, dtype " << dtype_name(ds.dtype)
    << ", sample shape " << dims_text(ds.sample_shape) << ", "
    << (index.is_object() ? index.value("storage", "raw") : std::string("raw")) << " records\n";
  int64_t smallest = -1, largest = 0, total = 0;
  if (index.is_object() && index.contains("chunks"))
    for (const auto& c : index["chunks"]) {
      const int64_t b = c.value("bytes", int64_t{0});
      smallest = smallest < 0 ? b : std::min(smallest, b);
      largest = std::max(largest, b), total += b;
    }
  o << "chunks: " << chunk_count(dir) << " of " << ds.chunk_samples << " samples, "
    << (smallest >> 10) << "-" << (largest >> 10) << " KiB each, " << (total >> 20)
    << " MiB in all (`mltrain data verify " << dir << "` checks their SHA-256)\n";
  describe_samples(ds, o);
  return o.str();
}

}  // namespace

std::string inspect_data(const std::string& path, const std::string& labels) {
  if (is_chunk_set(path)) return inspect_chunks(path);
  if (fs::is_directory(path))
    throw DataError(
        path, "a folder, but not a chunk set (no index.json)",
        "inspect its files one by one, or convert it: mltrain data convert " + path + " -o DIR");
  std::ostringstream o;
  if (!is_shard(path) && labels.empty()) {
    const Array a = read_array(path);
    o << path << ": " << dtype_name(a.dtype) << " " << a.shape_text() << "\n";
    return o.str();
  }
  const Dataset ds = load_dataset(path, labels, int64_t{1} << 30);
  o << path << ": " << (is_shard(path) ? "shard" : "array") << ", " << ds.count
    << " samples, dtype " << dtype_name(ds.dtype) << ", sample shape " << dims_text(ds.sample_shape)
    << "\n";
  describe_samples(ds, o);
  return o.str();
}

}  // namespace mltrain::data
