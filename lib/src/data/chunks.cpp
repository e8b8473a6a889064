// Chunk sets: a data set cut into ~128 MB files the loader maps a window at a time, so a set
// larger than memory streams with bounded resident pages.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>

#include "mltrain/core/checked.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/json.hpp"
#include "mltrain/core/sha256.hpp"
#include "mltrain/data/sources.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace mltrain::data {

namespace {

constexpr int64_t kPage = 4096;
int64_t page_up(int64_t x) { return (x + kPage - 1) / kPage * kPage; }

std::string chunk_name(int64_t c) {
  char b[32];
  std::snprintf(b, sizeof b, "chunk-%05lld.bin", static_cast<long long>(c));
  return b;
}

// A chunk file being written: bytes in memory until it is full, then written and hashed.
struct ChunkOut {
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> offsets;  // JPEG records: start of each record in `bytes`
  int64_t count = 0;
};

json flush_chunk(ChunkOut& c, const fs::path& dir, int64_t index, bool jpeg) {
  std::vector<uint8_t> file;
  if (jpeg) {  // offset table (count + 1 entries, relative to the file start), page-aligned
    const int64_t head = page_up(static_cast<int64_t>((c.offsets.size() + 1) * 8));
    file.assign(static_cast<size_t>(head), 0);
    std::vector<uint64_t> table;
    for (auto o : c.offsets) table.push_back(o + static_cast<uint64_t>(head));
    table.push_back(c.bytes.size() + static_cast<uint64_t>(head));
    std::memcpy(file.data(), table.data(), table.size() * 8);
    file.insert(file.end(), c.bytes.begin(), c.bytes.end());
  } else {
    file = std::move(c.bytes);
  }
  file.resize(static_cast<size_t>(page_up(static_cast<int64_t>(file.size()))), 0);
  const std::string name = chunk_name(index);
  AtomicFile f((dir / name).string());
  f.write(file.data(), file.size());
  f.commit();
  Sha256 hash;  // over the bytes as written, without a copy
  hash.update(file.data(), file.size());
  json j = {{"file", name}, {"count", c.count}, {"bytes", file.size()}, {"sha256", hash.hex()}};
  c = ChunkOut{};
  return j;
}

// Samples per chunk: raw records fill chunk_bytes exactly; JPEG records by the mean size of the
// first 256 encodings.
int64_t samples_per_chunk(const Dataset& ds, const ChunkWriteOptions& opt) {
  std::vector<uint8_t> buf;
  double per = static_cast<double>(ds.sample_bytes());
  if (opt.jpeg) {
    const int64_t n = std::min<int64_t>(ds.count, 256);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* px = ds.sample_into(i, buf);
      total += static_cast<double>(
          encode_jpeg(px, ds.sample_shape[0], ds.sample_shape[1], ds.sample_shape[2], opt.quality)
              .size());
    }
    per = std::max(1.0, total / static_cast<double>(std::max<int64_t>(n, 1)));
  }
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(opt.chunk_bytes) / per));
}

json write_targets(const Dataset& ds, const fs::path& dir) {
  std::string bytes;
  json t;
  if (ds.float_targets()) {
    const size_t n = static_cast<size_t>(ds.count * ds.target_elems());
    bytes.assign(reinterpret_cast<const char*>(ds.target(0)), n * sizeof(float));
    t = {{"kind", "float"}, {"shape", ds.target_shape}};
  } else {
    std::vector<int64_t> l(static_cast<size_t>(ds.count));
    for (int64_t i = 0; i < ds.count; ++i) l[static_cast<size_t>(i)] = ds.label(i);
    bytes.assign(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(int64_t));
    t = {{"kind", "class"}};
  }
  write_file_atomic((dir / "targets.bin").string(), bytes);
  t["file"] = "targets.bin";
  t["bytes"] = bytes.size();
  t["sha256"] = sha256_hex(bytes);
  return t;
}

}  // namespace

ConvertReport write_chunks(const Dataset& ds, const std::string& dir,
                           const ChunkWriteOptions& opt) {
  if (fs::exists(dir))
    throw DataError(dir, "already exists", "remove it or choose another -o folder");
  if (opt.jpeg && (ds.dtype != DType::kU8 || ds.sample_shape.size() != 3 ||
                   (ds.sample_shape[0] != 1 && ds.sample_shape[0] != 3)))
    throw DataError(ds.source,
                    "--store jpeg needs u8 images [1 or 3, H, W], got " +
                        std::string(dtype_name(ds.dtype)) + " samples",
                    "store raw records (the default)");
  if (ds.token_windows)
    throw DataError(ds.source, "token streams are already memory-mapped",
                    "train from them as they are");
  // Written into DIR.partial and renamed at the end: a killed convert leaves no half set behind
  // under the final name.
  const fs::path tmp = dir + ".partial";
  remove_tree(tmp);
  fs::create_directories(tmp);
  const int64_t per = samples_per_chunk(ds, opt);
  json chunks = json::array();
  ChunkOut cur;
  std::vector<uint8_t> buf;
  ConvertReport r;
  for (int64_t i = 0; i < ds.count; ++i) {
    const uint8_t* px = ds.sample_into(i, buf);
    if (!opt.jpeg && cur.bytes.empty())  // one allocation per chunk, not a doubling series
      cur.bytes.reserve(static_cast<size_t>(page_up(per * ds.sample_bytes())));
    if (opt.jpeg) {
      const auto enc =
          encode_jpeg(px, ds.sample_shape[0], ds.sample_shape[1], ds.sample_shape[2], opt.quality);
      cur.offsets.push_back(cur.bytes.size());
      cur.bytes.insert(cur.bytes.end(), enc.begin(), enc.end());
    } else {
      cur.bytes.insert(cur.bytes.end(), px, px + ds.sample_bytes());
    }
    if (++cur.count == per || i + 1 == ds.count) {
      chunks.push_back(flush_chunk(cur, tmp, static_cast<int64_t>(chunks.size()), opt.jpeg));
      r.bytes += chunks.back()["bytes"].get<int64_t>();
    }
  }
  json index = {{"format", "mltrain-chunks"},
                {"version", 1},
                {"count", ds.count},
                {"dtype", dtype_name(ds.dtype)},
                {"sample_shape", ds.sample_shape},
                {"storage", opt.jpeg ? "jpeg" : "raw"},
                {"num_classes", ds.num_classes},
                {"chunk_samples", per},
                {"targets", write_targets(ds, tmp)},
                {"chunks", chunks}};
  write_file_atomic((tmp / "index.json").string(), index.dump(1) + "\n");
  fs::rename(tmp, dir);
  fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
  r.samples = ds.count;
  r.chunks = static_cast<int64_t>(chunks.size());
  return r;
}

bool is_chunk_set(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "index.json", ec);
}

namespace {

struct ChunkInfo {
  std::string file, sha256;
  int64_t count = 0, bytes = 0;
};

struct Index {
  std::string dir;
  int64_t count = 0, per = 0, num_classes = 0;
  std::vector<int64_t> shape;
  DType dtype = DType::kU8;
  bool jpeg = false;
  json targets;
  std::vector<ChunkInfo> chunks;
};

// One chunk's hash against index.json: the training read (over the mapping) and `data verify`.
void require_hash(const std::string& path, int64_t c, const std::string& got,
                  const std::string& want) {
  if (got != want)
    throw DataError(path, "SHA-256 differs from index.json (chunk " + std::to_string(c) + ")",
                    "the chunk is corrupt: re-run `mltrain data convert` or restore it");
}

Index read_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  const std::string fix = "re-run `mltrain data convert` into a new folder";
  Index x;
  x.dir = dir;
  try {
    const json j = json::parse(read_file(path));
    if (j.value("format", "") != "mltrain-chunks" || json_int_or(j, "version", 0) != 1)
      throw DataError(path, "not a version-1 mltrain chunk index", fix);
    x.count = json_int(j.at("count"));
    x.per = json_int(j.at("chunk_samples"));
    x.num_classes = json_int(j.at("num_classes"));
    x.shape = json_ints(j.at("sample_shape"));
    const std::string dt = j.at("dtype").get<std::string>();
    if (dt != "u8" && dt != "f32") throw DataError(path, "dtype " + dt + " is not u8 or f32", fix);
    x.dtype = dt == "u8" ? DType::kU8 : DType::kF32;
    x.jpeg = j.at("storage").get<std::string>() == "jpeg";
    x.targets = j.at("targets");
    for (const auto& c : j.at("chunks"))
      x.chunks.push_back({c.at("file").get<std::string>(), c.at("sha256").get<std::string>(),
                          json_int(c.at("count")), json_int(c.at("bytes"))});
  } catch (const json::exception& e) {
    throw DataError(path, std::string("malformed index: ") + e.what(), fix);
  }
  int64_t total = 0;
  for (size_t c = 0; c < x.chunks.size(); ++c) {
    const bool last = c + 1 == x.chunks.size();
    if (x.chunks[c].count <= 0 || x.chunks[c].count > x.per ||
        (!last && x.chunks[c].count != x.per))
      throw DataError(path,
                      "chunk " + std::to_string(c) + " has count " +
                          std::to_string(x.chunks[c].count) + ", expected " + std::to_string(x.per),
                      fix);
    if (!is_plain_file_name(x.chunks[c].file))
      throw DataError(
          path,
          "chunk " + std::to_string(c) + " names '" + x.chunks[c].file + "', not a file of the set",
          fix);
    if (__builtin_add_overflow(total, x.chunks[c].count, &total))
      throw DataError(path, "chunk counts overflow", fix);
  }
  if (x.per <= 0 || total != x.count || x.shape.empty() ||
      std::any_of(x.shape.begin(), x.shape.end(), [](int64_t d) { return d <= 0; }))
    throw DataError(path,
                    "counts or shape disagree (" + std::to_string(total) +
                        " samples in chunks, count " + std::to_string(x.count) + ")",
                    fix);
  // A chunk's bytes (samples x sample bytes) must be a number, whatever the index claims.
  uint64_t bytes = 0;
  if (!checked_size(x.dtype == DType::kU8 ? 1 : 4, x.shape, &bytes))
    throw DataError(path, "sample_shape declares more bytes than any file can hold", fix);
  // map() needs count x sample bytes (raw records) or (count + 1) x 8 (a JPEG offset table).
  if (x.per == std::numeric_limits<int64_t>::max() ||
      !checked_size(std::max<uint64_t>(bytes, 8), {x.per + 1}, &bytes))
    throw DataError(path, "chunk_samples x sample size is more than any file can hold", fix);
  return x;
}

// Maps chunks on demand, keeping at most `resident` mapped (least recently used unmapped first:
// its pages leave this process's RSS), hashing each on its first mapping.
class ChunkSource : public SampleSource {
 public:
  ChunkSource(Index x, ChunkReadOptions opt)
      : x_(std::move(x)), opt_(opt), verified_(x_.chunks.size(), 0) {
    sample_bytes_ = static_cast<size_t>(x_.dtype == DType::kU8 ? 1 : 4);
    for (auto d : x_.shape) sample_bytes_ *= static_cast<size_t>(d);
    if (x_.jpeg) spec_ = ImageSpec{x_.shape[1], x_.shape[0], 0};
  }
  void read(int64_t i, uint8_t* dst) const override {
    const int64_t c = i / x_.per, k = i % x_.per;
    const auto m = map(c);
    const std::string where = (fs::path(x_.dir) / x_.chunks[c].file).string();
    if (!x_.jpeg) {
      std::memcpy(dst, m->data() + static_cast<size_t>(k) * sample_bytes_, sample_bytes_);
      return;
    }
    uint64_t lo = 0, hi = 0;
    std::memcpy(&lo, m->data() + k * 8, 8);
    std::memcpy(&hi, m->data() + (k + 1) * 8, 8);
    if (lo > hi || hi > m->size())
      throw DataError(where, "record " + std::to_string(k) + " lies outside the chunk",
                      "re-run `mltrain data convert`");
    decode_to_sample(m->data() + lo, static_cast<size_t>(hi - lo),
                     where + " record " + std::to_string(k), spec_, dst);
  }

 private:
  std::shared_ptr<MappedFile> map(int64_t c) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == c) {
        lru_.splice(lru_.begin(), lru_, it);
        return it->second;
      }
    const ChunkInfo& ci = x_.chunks[static_cast<size_t>(c)];
    const std::string path = (fs::path(x_.dir) / ci.file).string();
    auto m = std::make_shared<MappedFile>(path);
    const size_t need = x_.jpeg ? static_cast<size_t>(ci.count + 1) * 8
                                : static_cast<size_t>(ci.count) * sample_bytes_;
    if (m->size() != static_cast<size_t>(ci.bytes) || m->size() < need)
      throw DataError(
          path,
          "size " + std::to_string(m->size()) + " bytes, index says " + std::to_string(ci.bytes),
          "re-run `mltrain data convert`");
    // Records are read in shuffled order within the chunk: ask for the whole chunk now.
    madvise(const_cast<uint8_t*>(m->data()), m->size(), MADV_WILLNEED);
    if (opt_.verify && !verified_[static_cast<size_t>(c)]) {
      Sha256 h;
      h.update(m->data(), m->size());
      require_hash(path, c, h.hex(), ci.sha256);
      verified_[static_cast<size_t>(c)] = 1;
    }
    lru_.emplace_front(c, m);
    if (opt_.resident_chunks > 0)
      while (static_cast<int64_t>(lru_.size()) > opt_.resident_chunks) lru_.pop_back();
    return m;
  }

  Index x_;
  ChunkReadOptions opt_;
  ImageSpec spec_;
  size_t sample_bytes_ = 0;
  mutable std::mutex mu_;
  mutable std::list<std::pair<int64_t, std::shared_ptr<MappedFile>>> lru_;
  mutable std::vector<char> verified_;
};

// What index.json says of the targets file, read with its types checked.
struct TargetsEntry {
  std::string file, sha256;
  bool floats = false;
  std::vector<int64_t> shape;
  int64_t per = 1;  // values per sample
};

TargetsEntry targets_entry(const Index& x) {
  const std::string index = (fs::path(x.dir) / "index.json").string();
  const std::string fix = "re-run `mltrain data convert` into a new folder";
  TargetsEntry t;
  try {
    t.file = x.targets.at("file").get<std::string>();
    t.sha256 = x.targets.value("sha256", "");
    t.floats = x.targets.value("kind", "class") == "float";
    if (t.floats && x.targets.contains("shape")) t.shape = json_ints(x.targets.at("shape"));
  } catch (const json::exception& e) {
    throw DataError(index, std::string("malformed targets entry: ") + e.what(), fix);
  }
  if (!is_plain_file_name(t.file))
    throw DataError(index, "targets names '" + t.file + "', not a file of the set", fix);
  uint64_t per = 0, total = 0;
  if (!checked_size(1, t.shape, &per) ||
      std::any_of(t.shape.begin(), t.shape.end(), [](int64_t v) { return v <= 0; }))
    throw DataError(index, "targets shape is not a list of positive sizes", fix);
  t.per = static_cast<int64_t>(per);
  if (!checked_size(8, {x.count, t.per}, &total))
    throw DataError(index, "count x targets shape is more than any file can hold", fix);
  return t;
}

void attach_targets(Dataset& d, const Index& x) {
  const TargetsEntry te = targets_entry(x);
  const std::string path = (fs::path(x.dir) / te.file).string();
  const std::string bytes = read_file(path);
  if (sha256_hex(bytes) != te.sha256)
    throw DataError(path, "SHA-256 differs from index.json", "re-run `mltrain data convert`");
  const bool fl = te.floats;
  const int64_t per = te.per;
  const size_t want = static_cast<size_t>(x.count * per) * (fl ? 4 : 8);
  if (bytes.size() != want)
    throw DataError(path, std::to_string(bytes.size()) + " bytes, expected " + std::to_string(want),
                    "re-run `mltrain data convert`");
  if (fl) {
    auto t = std::make_shared<std::vector<float>>(static_cast<size_t>(x.count * per));
    std::memcpy(t->data(), bytes.data(), want);
    d.targets = t;
    d.target_shape = te.shape;
    d.labels = std::make_shared<std::vector<int64_t>>();
  } else {
    auto l = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(x.count));
    std::memcpy(l->data(), bytes.data(), want);
    for (size_t i = 0; i < l->size(); ++i)
      if ((*l)[i] < 0 || (*l)[i] >= std::max<int64_t>(x.num_classes, 1))
        throw DataError(path, "label out of range at index " + std::to_string(i),
                        "re-run `mltrain data convert`");
    d.labels = l;
  }
}

}  // namespace

int64_t chunk_count(const std::string& dir) {
  return static_cast<int64_t>(read_index(dir).chunks.size());
}

int64_t chunk_bytes(const std::string& dir) {
  int64_t m = 0;
  for (const auto& c : read_index(dir).chunks) m = std::max(m, c.bytes);
  return m;
}

Dataset load_chunks(const std::string& dir, const ChunkReadOptions& opt) {
  Index x = read_index(dir);
  if (x.jpeg && (x.shape.size() != 3 || x.shape[1] != x.shape[2]))
    throw DataError(dir, "JPEG chunk records need square [C, S, S] samples", "re-run convert");
  Dataset d;
  d.source = dir;
  d.dtype = x.dtype;
  d.count = x.count;
  d.sample_shape = x.shape;
  d.num_classes = x.num_classes;
  d.chunk_samples = x.per;
  attach_targets(d, x);
  d.reader = std::make_shared<ChunkSource>(std::move(x), opt);
  return d;
}

void verify_chunks(const std::string& dir) {
  const Index x = read_index(dir);
  for (size_t c = 0; c < x.chunks.size(); ++c) {
    const std::string path = (fs::path(dir) / x.chunks[c].file).string();
    require_hash(path, static_cast<int64_t>(c), sha256_file(path), x.chunks[c].sha256);
  }
}

}  // namespace mltrain::data
