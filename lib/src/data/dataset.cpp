#include "mltrain/data/dataset.hpp"

#include <charconv>
#include <cstdint>

#include <zlib.h>
#ifdef MLTRAIN_WITH_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "mltrain/config/format.hpp"
#include "mltrain/core/checked.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"

namespace mltrain::data {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kU8:
      return "u8";
    case DType::kI8:
      return "i8";
    case DType::kI16:
      return "i16";
    case DType::kU16:
      return "u16";
    case DType::kU32:
      return "u32";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kU8:
    case DType::kI8:
      return 1;
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kU32:
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 1;
}

int64_t Array::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string Array::shape_text() const {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {  // not "x" + to_string: GCC 12 false positive
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

namespace {

// The payload size a header declares, checked: a product of dimensions that does not fit in 63
// bits (a hostile or corrupt header) is a DataError, never a wrapped size that passes the
// truncation check.
size_t declared_payload_bytes(const Array& a, const std::string& path) {
  uint64_t n = 0;
  if (!checked_size(dtype_size(a.dtype), a.shape, &n))
    throw DataError(path,
                    "header declares shape " + a.shape_text() + " " + dtype_name(a.dtype) +
                        ", more bytes than any file can hold",
                    "the header is corrupt: re-create the file");
  return static_cast<size_t>(n);
}

struct Bytes {
  std::shared_ptr<const void> storage;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

bool has_gzip_magic(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  unsigned char m[2] = {0, 0};
  size_t n = std::fread(m, 1, 2, f);
  std::fclose(f);
  return n == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

// A single-member gzip file decoded in one call into a buffer of its trailer's size (ISIZE): about
// twice zlib's stream (the main job's 47 MB of images: 98 vs 210 ms). False when libdeflate is
// not built in or the file is anything else (several members, over 4 GiB, corrupt, truncated):
// zlib's stream then decodes it or names the fault, as before.
bool inflate_whole(const std::string& path, Bytes& b) {
#ifdef MLTRAIN_WITH_LIBDEFLATE
  const MappedFile in(path);
  if (in.size() < 18) return false;  // header 10 + trailer 8
  uint32_t isize = 0;
  std::memcpy(&isize, in.data() + in.size() - 4, 4);  // little-endian, as x86 and ARM
  // DEFLATE expands at most ~1032:1: a larger ISIZE is a damaged trailer (a truncated file ends in
  // arbitrary bytes), not a reason to allocate up to 4 GiB; zlib's stream names the fault.
  if (isize / 1032 > in.size()) return false;
  std::shared_ptr<uint8_t[]> out(new uint8_t[std::max<size_t>(isize, 1)]);
  libdeflate_decompressor* d = libdeflate_alloc_decompressor();
  if (!d) return false;
  size_t used = 0, got = 0;
  const auto rc =
      libdeflate_gzip_decompress_ex(d, in.data(), in.size(), out.get(), isize, &used, &got);
  libdeflate_free_decompressor(d);
  if (rc != LIBDEFLATE_SUCCESS || used != in.size() || got != isize) return false;
  b.data = out.get();
  b.size = got;
  b.storage = std::move(out);
  return true;
#else
  (void)path;
  (void)b;
  return false;
#endif
}

Bytes read_bytes(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw DataError(path, "file not found",
                    "check data.* paths (or install dataset-fashion-mnist)");
  Bytes b;
  if (has_gzip_magic(path)) {
    if (inflate_whole(path, b)) return b;
    gzFile gz = gzopen(path.c_str(), "rb");
    if (!gz) throw DataError(path, "cannot open gzip file");
    gzbuffer(gz, 1 << 20);
    auto buf = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint8_t> chunk(1 << 20);
    for (;;) {
      int n = gzread(gz, chunk.data(), static_cast<unsigned>(chunk.size()));
      if (n < 0) {
        int code = 0;
        std::string msg = gzerror(gz, &code);
        gzclose(gz);
        throw DataError(path, "corrupt gzip stream (" + msg + ")",
                        "re-download or re-create the file");
      }
      if (n == 0) break;
      buf->insert(buf->end(), chunk.begin(), chunk.begin() + n);
    }
    int code = 0;
    const char* msg = gzerror(gz, &code);
    std::string err = (code != Z_OK && code != Z_STREAM_END) ? msg : "";
    gzclose(gz);
    if (!err.empty())
      throw DataError(path, "truncated or corrupt gzip stream (" + err + ")",
                      "re-download or re-create the file");
    b.data = buf->data();
    b.size = buf->size();
    b.storage = buf;
  } else {
    auto m = std::make_shared<MappedFile>(path);
    b.data = m->data();
    b.size = m->size();
    b.storage = m;
  }
  return b;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

Array parse_idx(const std::string& path, const Bytes& b) {
  if (b.size < 4)
    throw DataError(path,
                    "truncated: " + std::to_string(b.size) + " bytes, too short for an IDX header");
  if (b.data[0] != 0 || b.data[1] != 0)
    throw DataError(path, "wrong magic: not an IDX file (first two bytes must be 0)",
                    "pass an IDX (.idx/-ubyte, optionally .gz), .npy or .shard file");
  Array a;
  a.source = path;
  switch (b.data[2]) {
    case 0x08:
      a.dtype = DType::kU8;
      break;
    case 0x09:
      a.dtype = DType::kI8;
      break;
    case 0x0B:
      a.dtype = DType::kI16;
      break;
    case 0x0C:
      a.dtype = DType::kI32;
      break;
    case 0x0D:
      a.dtype = DType::kF32;
      break;
    case 0x0E:
      a.dtype = DType::kF64;
      break;
    default: {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02X", b.data[2]);
      throw DataError(path, std::string("wrong magic: unknown IDX element type ") + code);
    }
  }
  const int ndim = b.data[3];
  if (ndim < 1 || ndim > 4)
    throw DataError(path,
                    "IDX header declares " + std::to_string(ndim) + " dimensions (1-4 supported)");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (b.size < header) throw DataError(path, "truncated: the IDX header itself is incomplete");
  for (int i = 0; i < ndim; ++i) a.shape.push_back(be32(b.data + 4 + 4 * i));
  const size_t expect = header + declared_payload_bytes(a, path);
  if (b.size < expect)
    throw DataError(path,
                    "truncated: header says " + a.shape_text() + " " + dtype_name(a.dtype) + " (" +
                        std::to_string(expect) + " bytes), file has " + std::to_string(b.size),
                    "re-download or re-create the file");
  if (b.size > expect)
    throw DataError(path,
                    std::to_string(b.size - expect) + " unexpected trailing bytes after " +
                        a.shape_text() + " " + dtype_name(a.dtype) + " data",
                    "the header and the payload disagree: re-create the file");
  if (a.dtype != DType::kU8 && a.dtype != DType::kI8)
  // IDX stores multi-byte elements big-endian; convert once into native order.
  {
    auto buf = std::make_shared<std::vector<uint8_t>>(b.data + header, b.data + expect);
    const size_t w = dtype_size(a.dtype);
    for (size_t i = 0; i + w <= buf->size(); i += w)
      std::reverse(buf->begin() + i, buf->begin() + i + w);
    a.data = buf->data();
    a.storage = buf;
    return a;
  }
  a.data = b.data + header;
  a.storage = b.storage;
  return a;
}

std::string dict_value(const std::string& h, const std::string& key) {
  auto k = h.find("'" + key + "'");
  if (k == std::string::npos) return "";
  auto colon = h.find(':', k);
  if (colon == std::string::npos) return "";
  size_t i = colon + 1;
  while (i < h.size() && h[i] == ' ') ++i;
  if (i >= h.size()) return "";
  if (h[i] == '(') {
    auto e = h.find(')', i);
    return e == std::string::npos ? "" : h.substr(i, e - i + 1);
  }
  if (h[i] == '\'') {
    auto e = h.find('\'', i + 1);
    return e == std::string::npos ? "" : h.substr(i + 1, e - i - 1);
  }
  auto e = h.find_first_of(",}", i);
  return h.substr(i, e - i);
}

Array parse_npy(const std::string& path, const Bytes& b) {
  static const char kMagic[] = "\x93NUMPY";
  if (b.size < 10 || std::memcmp(b.data, kMagic, 6) != 0)
    throw DataError(path, "wrong magic: not a .npy file", "save arrays with numpy.save");
  const int major = b.data[6];
  size_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = b.data[8] | (size_t(b.data[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size < 12) throw DataError(path, "truncated: .npy header incomplete");
    hlen = b.data[8] | (size_t(b.data[9]) << 8) | (size_t(b.data[10]) << 16) |
           (size_t(b.data[11]) << 24);
    start = 12;
  } else {
    throw DataError(
        path, ".npy format version " + std::to_string(major) + " is not supported (1, 2, 3 are)");
  }
  if (b.size < start + hlen)
    throw DataError(path, "truncated: .npy header says " + std::to_string(hlen) + " bytes");
  const std::string h(reinterpret_cast<const char*>(b.data + start), hlen);
  const std::string descr = dict_value(h, "descr"), fortran = dict_value(h, "fortran_order"),
                    shape = dict_value(h, "shape");
  if (descr.empty() || fortran.empty() || shape.empty())
    throw DataError(path, "malformed .npy header: " + h.substr(0, 120));
  Array a;
  a.source = path;
  if (descr == "|u1" || descr == "<u1")
    a.dtype = DType::kU8;
  else if (descr == "|i1" || descr == "<i1")
    a.dtype = DType::kI8;
  else if (descr == "<i2")
    a.dtype = DType::kI16;
  else if (descr == "<u2")
    a.dtype = DType::kU16;
  else if (descr == "<i4")
    a.dtype = DType::kI32;
  else if (descr == "<u4")
    a.dtype = DType::kU32;
  else if (descr == "<i8")
    a.dtype = DType::kI64;
  else if (descr == "<f4")
    a.dtype = DType::kF32;
  else if (descr == "<f8")
    a.dtype = DType::kF64;
  else
    throw DataError(
        path, ".npy dtype '" + descr + "' is not supported",
        "use uint8, (u)int16/32, int64 or float32/64 in little-endian order (arr.astype(...))");
  if (fortran.find("True") != std::string::npos)
    throw DataError(path, ".npy array is in Fortran order",
                    "save numpy.ascontiguousarray(arr) instead");
  // shape: "(60000, 28, 28)" or "(60000,)" or "()"
  std::string inner = shape.substr(1, shape.size() - 2);
  size_t i = 0;
  while (i < inner.size()) {
    while (i < inner.size() && (inner[i] == ' ' || inner[i] == ',')) ++i;
    if (i >= inner.size()) break;
    size_t j = i;
    while (j < inner.size() && std::isdigit(static_cast<unsigned char>(inner[j]))) ++j;
    if (j == i) throw DataError(path, "malformed .npy shape " + shape);
    int64_t d = 0;
    const auto r = std::from_chars(inner.data() + i, inner.data() + j, d);
    if (r.ec != std::errc())
      throw DataError(
          path, ".npy shape " + shape + ": dimension '" + inner.substr(i, j - i) + "' is too large",
          "the header is corrupt: re-create the file");
    a.shape.push_back(d);
    i = j;
  }
  if (a.shape.empty())
    throw DataError(path, ".npy holds a scalar; expected an array with a sample dimension");
  const size_t expect = start + hlen + declared_payload_bytes(a, path);
  if (b.size < expect)
    throw DataError(path, "truncated: header says " + a.shape_text() + " " + dtype_name(a.dtype) +
                              " (" + std::to_string(expect) + " bytes), file has " +
                              std::to_string(b.size));
  a.data = b.data + start + hlen;
  a.storage = b.storage;
  return a;
}

}  // namespace

Array read_idx(const std::string& path) { return parse_idx(path, read_bytes(path)); }
Array read_npy(const std::string& path) { return parse_npy(path, read_bytes(path)); }

Array read_array(const std::string& path) {
  Bytes b = read_bytes(path);
  if (b.size >= 6 && std::memcmp(b.data, "\x93NUMPY", 6) == 0) return parse_npy(path, b);
  if (b.size >= 8 && std::memcmp(b.data, "MLTSHRD", 7) == 0)
    throw DataError(path, "is a shard; it holds images and labels together",
                    "pass it as images with no labels file");
  return parse_idx(path, b);
}

int64_t Dataset::sample_elems() const {
  int64_t n = 1;
  for (auto d : sample_shape) n *= d;
  return n;
}

Dataset Dataset::slice(int64_t begin, int64_t end) const {
  Dataset d = *this;
  begin = std::clamp<int64_t>(begin, 0, count);
  end = std::clamp<int64_t>(end, begin, count);
  if (reader)
    d.reader_offset = reader_offset + begin;
  else
    d.data = data + static_cast<size_t>(begin) * sample_bytes();
  d.label_offset = label_offset + begin;
  d.count = end - begin;
  return d;
}

Dataset Dataset::gather(const std::vector<int64_t>& idx) const {
  Dataset d = *this;
  const size_t bytes = sample_bytes();
  auto buf = std::make_shared<std::vector<uint8_t>>(idx.size() * bytes);
  std::vector<uint8_t> tmp;
  for (size_t j = 0; j < idx.size(); ++j)
    std::memcpy(buf->data() + j * bytes, sample_into(idx[j], tmp), bytes);
  d.data = buf->data();
  d.storage = buf;
  d.reader.reset();
  d.reader_offset = 0;
  d.chunk_samples = 0;
  d.label_offset = 0;
  d.count = int64_t(idx.size());
  if (float_targets()) {
    const auto e = size_t(target_elems());
    auto t = std::make_shared<std::vector<float>>(idx.size() * e);
    for (size_t j = 0; j < idx.size(); ++j) std::memcpy(t->data() + j * e, target(idx[j]), e * 4);
    d.targets = t;
  } else if (labels) {
    auto l = std::make_shared<std::vector<int64_t>>(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) (*l)[j] = label(idx[j]);
    d.labels = l;
  }
  return d;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> kfold_split(int64_t n, int64_t k,
                                                                  int64_t fold, uint64_t seed) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  // Fisher-Yates with SplitMix64 draws: the same permutation on every platform and library
  // (std::shuffle's use of the engine is implementation-defined).
  uint64_t z = seed ^ 0x6b66666f6c64ULL;  // "kfold"
  auto next = [&z] {
    z += 0x9E3779B97F4A7C15ULL;
    uint64_t x = z;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[size_t(i)], perm[size_t(next() % uint64_t(i + 1))]);
  const int64_t lo = fold * n / k, hi = (fold + 1) * n / k;
  std::vector<int64_t> train, val(perm.begin() + lo, perm.begin() + hi);
  train.reserve(size_t(n - (hi - lo)));
  train.insert(train.end(), perm.begin(), perm.begin() + lo);
  train.insert(train.end(), perm.begin() + hi, perm.end());
  std::sort(train.begin(), train.end());
  std::sort(val.begin(), val.end());
  return {train, val};
}

const uint8_t* Dataset::sample_into(int64_t i, std::vector<uint8_t>& buf) const {
  if (!reader) return sample(i);
  buf.resize(sample_bytes());
  reader->read(reader_offset + i, buf.data());
  return buf.data();
}

// One element of a numeric array as a double.
static double element_as_double(const Array& a, int64_t i) {
  const uint8_t* p = a.data + static_cast<size_t>(i) * dtype_size(a.dtype);
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return static_cast<double>(x);
  };
  switch (a.dtype) {
    case DType::kU8:
      return *p;
    case DType::kI8:
      return static_cast<int8_t>(*p);
    case DType::kI16:
      return load(int16_t{});
    case DType::kU16:
      return load(uint16_t{});
    case DType::kU32:
      return load(uint32_t{});
    case DType::kI32:
      return load(int32_t{});
    case DType::kI64:
      return load(int64_t{});
    case DType::kF32:
      return load(float{});
    case DType::kF64:
      return load(double{});
  }
  return 0;
}

// The inputs of a data set (u8 or f32, [N, ...]; [N,H,W] gains a channel), targets still unset.
static Dataset dataset_of_inputs(const Array& img) {
  if (img.dtype != DType::kU8 && img.dtype != DType::kF32)
    throw DataError(img.source,
                    std::string("images must be u8 or f32, got ") + dtype_name(img.dtype),
                    "convert with arr.astype(numpy.float32)");
  if (img.shape.size() < 2)
    throw DataError(img.source, "images need a sample dimension and at least one more, got shape " +
                                    img.shape_text());
  Dataset d;
  d.source = img.source;
  d.dtype = img.dtype;
  d.count = img.shape[0];
  d.sample_shape.assign(img.shape.begin() + 1, img.shape.end());
  if (d.sample_shape.size() == 2)
    d.sample_shape.insert(d.sample_shape.begin(), 1);  // [H,W] -> [1,H,W]
  d.data = img.data;
  d.storage = img.storage;
  return d;
}

static std::shared_ptr<std::vector<int64_t>> labels_from(const Array& a, int64_t num_classes) {
  if (a.shape.size() != 1)
    throw DataError(a.source, "labels must be a 1-D array, got shape " + a.shape_text());
  if (a.dtype == DType::kF32 || a.dtype == DType::kF64)
    throw DataError(a.source, std::string("labels must be integers, got ") + dtype_name(a.dtype));
  auto out = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(a.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double v = element_as_double(a, i);  // exact for every label in range
    if (v < 0 || v >= static_cast<double>(num_classes))
      throw DataError(a.source,
                      "label out of range at index " + std::to_string(i) + ": " +
                          config::format_fixed(v, 0) + " not in [0, " +
                          std::to_string(num_classes) + ")",
                      "fix the labels or set data.num_classes");
    (*out)[static_cast<size_t>(i)] = static_cast<int64_t>(v);
  }
  return out;
}

int64_t Dataset::target_elems() const {
  int64_t n = 1;
  for (auto d : target_shape) n *= d;
  return n;
}

// Float targets for `spec`, checked against the sample count (and 0/1 for multilabel).
static void attach_float_targets(Dataset& d, const std::string& path, const TargetSpec& spec) {
  Array a = read_array(path);
  if (a.shape.empty() || a.shape[0] != d.count)
    throw DataError(path,
                    "shape mismatch: targets " + a.shape_text() + " for " +
                        std::to_string(d.count) + " samples in " + d.source,
                    "the first dimension of the targets must count the samples");
  d.target_shape.assign(a.shape.begin() + 1, a.shape.end());
  const bool multi_hot = spec.kind == TargetKind::kMultiHot;
  if (multi_hot && d.target_shape != std::vector<int64_t>{spec.num_classes})
    throw DataError(path,
                    "multilabel targets must be [N, num_classes] = [N, " +
                        std::to_string(spec.num_classes) + "], got " + a.shape_text(),
                    "store one 0/1 column per class, or set data.num_classes");
  auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(a.numel()));
  const int64_t per = std::max<int64_t>(1, d.target_elems());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double v = element_as_double(a, i);
    const std::string where =
        "sample " + std::to_string(i / per) + ", element " + std::to_string(i % per);
    if (!std::isfinite(v))
      throw DataError(path, "target at " + where + " is not finite",
                      "drop or fill the NaN/inf targets before training");
    if (multi_hot && v != 0 && v != 1)
      throw DataError(path, "multilabel target at " + where + " is " + std::to_string(v),
                      "store labels as 0/1 (multi-hot)");
    (*values)[static_cast<size_t>(i)] = static_cast<float>(v);
  }
  d.targets = values;
  d.labels = std::make_shared<std::vector<int64_t>>();
  d.num_classes = spec.num_classes;
}

Dataset load_dataset(const std::string& images, const std::string& targets,
                     const TargetSpec& spec) {
  TargetSpec chosen = spec;
  if (spec.kind == TargetKind::kAuto && !targets.empty() && !is_shard(images)) {
    const Array a = read_array(targets);
    const bool ids = a.shape.size() == 1 && a.dtype != DType::kF32 && a.dtype != DType::kF64;
    chosen.kind = ids ? TargetKind::kClassId : TargetKind::kFloat;
  }
  if (chosen.kind == TargetKind::kClassId || chosen.kind == TargetKind::kAuto)
    return load_dataset(images, targets, spec.num_classes);
  if (is_shard(images))
    throw DataError(images, "shards hold class labels; float and multilabel targets do not fit",
                    "pass the inputs as .npy or IDX with a targets .npy");
  if (targets.empty())
    throw DataError(images, "no targets file given", "set the matching *_labels path");
  Dataset d = dataset_of_inputs(read_array(images));
  attach_float_targets(d, targets, chosen);
  return d;
}

Dataset load_dataset(const std::string& images, const std::string& labels, int64_t num_classes) {
  if (is_shard(images)) {
    Dataset d = read_shard(images);
    for (int64_t i = 0; i < d.count; ++i)
      if (d.label(i) < 0 || d.label(i) >= num_classes)
        throw DataError(images,
                        "label out of range at index " + std::to_string(i) + ": " +
                            std::to_string(d.label(i)) + " not in [0, " +
                            std::to_string(num_classes) + ")",
                        "set data.num_classes to match the data");
    d.num_classes = num_classes;
    return d;
  }
  Array img = read_array(images);
  if (labels.empty())
    throw DataError(images, "no labels file given", "set the matching *_labels path");
  Array lab = read_array(labels);
  auto lbl = labels_from(lab, num_classes);
  if (static_cast<int64_t>(lbl->size()) != img.shape[0])
    throw DataError(labels,
                    "shape mismatch: " + std::to_string(lbl->size()) + " labels for " +
                        std::to_string(img.shape[0]) + " images in " + images,
                    "pair each images file with its own labels file");
  Dataset d = dataset_of_inputs(img);
  d.labels = lbl;
  d.num_classes = num_classes;
  return d;
}

Dataset load_inputs(const std::string& images) {
  if (is_shard(images)) return read_shard(images);
  Dataset d = dataset_of_inputs(read_array(images));
  d.labels = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(d.count), 0);
  return d;
}

// ---- shard v1 ----
namespace {
constexpr char kShardMagic[8] = {'M', 'L', 'T', 'S', 'H', 'R', 'D', '1'};
constexpr size_t kAlign = 4096;
struct ShardHeader {
  char magic[8];
  uint32_t version, dtype, ndim, num_classes;
  int64_t count;
  int64_t shape[4];
  uint64_t data_offset, data_bytes, labels_offset, labels_bytes;
};
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

bool is_shard(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char m[8] = {};
  size_t n = std::fread(m, 1, 8, f);
  std::fclose(f);
  return n == 8 && std::memcmp(m, kShardMagic, 7) == 0;
}

Dataset read_shard(const std::string& path) {
  auto m = std::make_shared<MappedFile>(path);
  if (m->size() < sizeof(ShardHeader) || std::memcmp(m->data(), kShardMagic, 7) != 0)
    throw DataError(path, "wrong magic: not an mltrain shard",
                    "create shards with `mltrain data convert`");
  ShardHeader h;
  std::memcpy(&h, m->data(), sizeof h);
  if (h.magic[7] != '1' || h.version != 1)
    throw DataError(
        path, "shard version " + std::to_string(h.version) + " is not supported by this mltrain");
  if (h.ndim < 1 || h.ndim > 4 || (h.dtype != 1 && h.dtype != 2) || h.count < 0)
    throw DataError(path, "corrupt shard header");
  Dataset d;
  d.source = path;
  d.dtype = h.dtype == 1 ? DType::kU8 : DType::kF32;
  d.count = h.count;
  d.sample_shape.assign(h.shape, h.shape + h.ndim);
  // Checked: a forged shape must not wrap to a match, nor overflow sample_bytes() later (with a
  // count of 0 the data size alone would not tell).
  uint64_t sample = 0, data_bytes = 0, labels_bytes = 0;
  if (!checked_size(dtype_size(d.dtype), d.sample_shape, &sample) ||
      std::any_of(d.sample_shape.begin(), d.sample_shape.end(), [](int64_t v) { return v <= 0; }))
    throw DataError(path, "corrupt shard header: sample shape is not a list of sizes");
  if (!checked_size(sample, {d.count}, &data_bytes) || !checked_size(8, {d.count}, &labels_bytes))
    throw DataError(path, "corrupt shard header: sizes past any file");
  if (h.data_bytes != data_bytes || h.labels_bytes != labels_bytes)
    throw DataError(path, "corrupt shard header: sizes disagree with count and shape");
  if (h.labels_offset > m->size() || h.data_offset > m->size() ||  // no wrap in the sums below
      m->size() - h.labels_offset < h.labels_bytes || m->size() - h.data_offset < h.data_bytes)
    throw DataError(path,
                    "truncated: shard needs " + std::to_string(h.labels_offset + h.labels_bytes) +
                        " bytes, file has " + std::to_string(m->size()),
                    "re-run `mltrain data convert`");
  auto lbl = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(d.count));
  if (h.labels_bytes > 0) std::memcpy(lbl->data(), m->data() + h.labels_offset, h.labels_bytes);
  d.data = m->data() + h.data_offset;
  d.storage = m;
  d.labels = lbl;
  d.num_classes = h.num_classes;
  return d;
}

void write_shard(const Dataset& ds, const std::string& path) {
  if (ds.sample_shape.size() > 4)
    throw DataError(ds.source, "samples with more than 4 dimensions cannot be sharded");
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, 8);
  h.version = 1;
  h.dtype = ds.dtype == DType::kU8 ? 1 : 2;
  h.ndim = static_cast<uint32_t>(ds.sample_shape.size());
  h.num_classes = static_cast<uint32_t>(ds.num_classes);
  h.count = ds.count;
  for (size_t i = 0; i < ds.sample_shape.size(); ++i) h.shape[i] = ds.sample_shape[i];
  h.data_offset = kAlign;
  h.data_bytes = static_cast<uint64_t>(ds.count) * ds.sample_bytes();
  h.labels_offset = align_up(h.data_offset + h.data_bytes);
  h.labels_bytes = static_cast<uint64_t>(ds.count) * 8;
  AtomicFile f(path);
  std::vector<uint8_t> head(kAlign, 0);
  std::memcpy(head.data(), &h, sizeof h);
  f.write(head.data(), head.size());
  f.write(ds.data, h.data_bytes);
  std::vector<uint8_t> pad(h.labels_offset - (h.data_offset + h.data_bytes), 0);
  f.write(pad.data(), pad.size());
  std::vector<int64_t> labels(static_cast<size_t>(ds.count));
  for (int64_t i = 0; i < ds.count; ++i) labels[static_cast<size_t>(i)] = ds.label(i);
  f.write(labels.data(), h.labels_bytes);
  f.commit();
}

}  // namespace mltrain::data
