#include "mltrain/formats/tensorboard.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "mltrain/core/error.hpp"

namespace mltrain::formats {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// Protobuf wire format, just what Event/Summary need.
void varint(std::string& o, uint64_t v) {
  while (v >= 0x80) {
    o += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  o += static_cast<char>(v);
}
void key(std::string& o, int field, int wire) {
  varint(o, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void f64(std::string& o, int field, double v) {
  key(o, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);
  o.append(b, 8);
}
void f32(std::string& o, int field, float v) {
  key(o, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  o.append(b, 4);
}
void bytes(std::string& o, int field, const std::string& v) {
  key(o, field, 2);
  varint(o, v.size());
  o += v;
}
void packed_doubles(std::string& o, int field, const std::vector<double>& v) {
  std::string p;
  for (double d : v) {
    char b[8];
    std::memcpy(b, &d, 8);
    p.append(b, 8);
  }
  bytes(o, field, p);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event(double wall, int64_t step, const std::string& summary_or_version,
                  bool is_version) {
  std::string e;
  f64(e, 1, wall);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  bytes(e, is_version ? 3 : 5, summary_or_version);
  return e;
}

// Reader side.
struct Cursor {
  const std::string& s;
  size_t i = 0;
  bool done() const { return i >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= s.size()) throw std::runtime_error("truncated varint");
      const uint8_t b = static_cast<uint8_t>(s[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint too long");
  }
  template <class T>
  T fixed() {
    if (i + sizeof(T) > s.size()) throw std::runtime_error("truncated fixed field");
    T v;
    std::memcpy(&v, s.data() + i, sizeof(T));
    i += sizeof(T);
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    if (i + n > s.size()) throw std::runtime_error("truncated length-delimited field");
    std::string out = s.substr(i, n);
    i += n;
    return out;
  }
  void skip(int wire) {
    if (wire == 0)
      varint();
    else if (wire == 1)
      i += 8;
    else if (wire == 2)
      bytes();
    else if (wire == 5)
      i += 4;
    else
      throw std::runtime_error("unknown wire type " + std::to_string(wire));
  }
};

std::vector<double> unpack_doubles(const std::string& p) {
  std::vector<double> v(p.size() / 8);
  std::memcpy(v.data(), p.data(), v.size() * 8);
  return v;
}

TbEvent::Value decode_value(const std::string& s) {
  TbEvent::Value v;
  Cursor c{s};
  while (!c.done()) {
    const uint64_t k = c.varint();
    const int field = static_cast<int>(k >> 3), wire = static_cast<int>(k & 7);
    if (field == 1 && wire == 2)
      v.tag = c.bytes();
    else if (field == 2 && wire == 5)
      v.has_simple = true, v.simple_value = c.fixed<float>();
    else if (field == 5 && wire == 2) {
      v.has_histo = true;
      const std::string h = c.bytes();
      Cursor hc{h};
      while (!hc.done()) {
        const uint64_t hk = hc.varint();
        const int hf = static_cast<int>(hk >> 3), hw = static_cast<int>(hk & 7);
        if (hw == 1 && hf >= 1 && hf <= 5) {
          const double d = hc.fixed<double>();
          if (hf == 1) v.histo_min = d;
          if (hf == 2) v.histo_max = d;
          if (hf == 3) v.histo_num = d;
          if (hf == 4) v.histo_sum = d;
        } else if (hw == 2 && hf == 6) {
          v.bucket_limit = unpack_doubles(hc.bytes());
        } else if (hw == 2 && hf == 7) {
          v.bucket = unpack_doubles(hc.bytes());
        } else {
          hc.skip(hw);
        }
      }
    } else
      c.skip(wire);
  }
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TbWriter::TbWriter(const std::string& dir) {
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." +
            host + "." + std::to_string(::getpid()) + ".mltrain"))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_)
    throw RuntimeError(path_, "cannot create the TensorBoard event file",
                       "check the run folder is writable");
  record(event(now_seconds(), 0, "brain.Event:2", true));
  out_.flush();
}

void TbWriter::record(const std::string& payload) {
  const uint64_t len = payload.size();
  char head[12];
  std::memcpy(head, &len, 8);
  const uint32_t lc = masked_crc32c(head, 8);
  std::memcpy(head + 8, &lc, 4);
  out_.write(head, 12);
  out_.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  const uint32_t dc = masked_crc32c(payload.data(), payload.size());
  out_.write(reinterpret_cast<const char*>(&dc), 4);
}

void TbWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v;
  bytes(v, 1, tag);
  f32(v, 2, static_cast<float>(value));
  std::string summary;
  bytes(summary, 1, v);
  record(event(now_seconds(), step, summary, false));
}

void TbWriter::histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                         int nb) {
  if (values.empty()) return;
  double lo = values[0], hi = values[0], sum = 0, sq = 0;
  for (double x : values) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sq += x * x;
  }
  std::vector<double> limits(static_cast<size_t>(nb)), counts(static_cast<size_t>(nb), 0.0);
  const double width = (hi - lo) / nb;
  for (int b = 0; b < nb; ++b) limits[static_cast<size_t>(b)] = lo + width * (b + 1);
  limits.back() = hi;
  for (double x : values) {
    int b = width > 0 ? static_cast<int>((x - lo) / width) : 0;
    counts[static_cast<size_t>(std::clamp(b, 0, nb - 1))] += 1;
  }
  std::string h;
  f64(h, 1, lo);
  f64(h, 2, hi);
  f64(h, 3, static_cast<double>(values.size()));
  f64(h, 4, sum);
  f64(h, 5, sq);
  packed_doubles(h, 6, limits);
  packed_doubles(h, 7, counts);
  std::string v;
  bytes(v, 1, tag);
  bytes(v, 5, h);
  std::string summary;
  bytes(summary, 1, v);
  record(event(now_seconds(), step, summary, false));
}

std::vector<TbEvent> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open the event file");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TbEvent> out;
  size_t i = 0;
  for (int64_t rec = 0; i < all.size(); ++rec) {
    const std::string where = "record " + std::to_string(rec) + " at byte " + std::to_string(i);
    if (i + 12 > all.size()) throw DataError(path, where + ": truncated header");
    uint64_t len;
    uint32_t lc, dc;
    std::memcpy(&len, all.data() + i, 8);
    std::memcpy(&lc, all.data() + i + 8, 4);
    if (masked_crc32c(all.data() + i, 8) != lc)
      throw DataError(path, where + ": length CRC mismatch");
    if (i + 12 + len + 4 > all.size()) throw DataError(path, where + ": truncated payload");
    const std::string payload = all.substr(i + 12, len);
    std::memcpy(&dc, all.data() + i + 12 + len, 4);
    if (masked_crc32c(payload.data(), payload.size()) != dc)
      throw DataError(path, where + ": data CRC mismatch");
    i += 12 + len + 4;
    TbEvent e;
    try {
      Cursor c{payload};
      while (!c.done()) {
        const uint64_t k = c.varint();
        const int field = static_cast<int>(k >> 3), wire = static_cast<int>(k & 7);
        if (field == 1 && wire == 1)
          e.wall_time = c.fixed<double>();
        else if (field == 2 && wire == 0)
          e.step = static_cast<int64_t>(c.varint());
        else if (field == 3 && wire == 2)
          e.file_version = c.bytes();
        else if (field == 5 && wire == 2) {
          const std::string sm = c.bytes();
          Cursor sc{sm};
          while (!sc.done()) {
            const uint64_t sk = sc.varint();
            if ((sk >> 3) == 1 && (sk & 7) == 2)
              e.values.push_back(decode_value(sc.bytes()));
            else
              sc.skip(static_cast<int>(sk & 7));
          }
        } else
          c.skip(wire);
      }
    } catch (const std::runtime_error& err) {
      throw DataError(path, where + ": bad Event encoding (" + err.what() + ")");
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace mltrain::formats
