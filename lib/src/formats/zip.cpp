#include "mltrain/formats/zip.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"

namespace mltrain::formats {
namespace {
// Record signatures and sizes from PKWARE's APPNOTE.TXT (sections 4.3.7, 4.3.12, 4.3.14-16).
constexpr uint32_t kLocal = 0x04034b50, kCentral = 0x02014b50, kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50, kLocator64 = 0x07064b50;
constexpr size_t kEndSize = 22, kLocatorSize = 20, kEnd64Size = 56, kCentralSize = 46,
                 kLocalSize = 30;

uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) { return uint32_t(u16(p)) | (uint32_t(u16(p + 2)) << 16); }
uint64_t u64(const uint8_t* p) { return uint64_t(u32(p)) | (uint64_t(u32(p + 4)) << 32); }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw DataError(path, "not a readable zip archive: " + what,
                  "the file is damaged or truncated; save it again (torch.export.save(ep, path))");
}

// True when [offset, offset + n) lies inside a file of `size` bytes, without overflow.
bool inside(uint64_t offset, uint64_t n, uint64_t size) {
  return offset <= size && n <= size - offset;
}
}  // namespace

ZipReader::ZipReader(const std::string& path) : path_(path) {
  file_ = std::make_unique<MappedFile>(path);
  const uint8_t* d = file_->data();
  const uint64_t size = file_->size();
  if (size < kEndSize) bad(path, std::to_string(size) + " bytes, shorter than a zip's end record");
  // The end record sits in the last 22 + 65535 (its comment) bytes; search backwards.
  int64_t end = -1;
  const uint64_t lowest = size > kEndSize + 65535 ? size - kEndSize - 65535 : 0;
  for (uint64_t at = size - kEndSize + 1; at-- > lowest;)
    if (u32(d + at) == kEnd) {
      end = int64_t(at);
      break;
    }
  if (end < 0) bad(path, "no end-of-central-directory record (not a zip, or cut short)");
  const uint8_t* e = d + end;
  uint64_t count = u16(e + 10), cd_size = u32(e + 12), cd_offset = u32(e + 16);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    if (uint64_t(end) < kLocatorSize || u32(d + end - kLocatorSize) != kLocator64)
      bad(path, "a zip64 archive without its zip64 locator");
    const uint64_t at = u64(d + end - kLocatorSize + 8);
    if (!inside(at, kEnd64Size, size) || u32(d + at) != kEnd64)
      bad(path, "the zip64 end record is missing at offset " + std::to_string(at));
    count = u64(d + at + 32);
    cd_size = u64(d + at + 40);
    cd_offset = u64(d + at + 48);
  }
  if (!inside(cd_offset, cd_size, size))
    bad(path, "the central directory (offset " + std::to_string(cd_offset) + ", " +
                  std::to_string(cd_size) + " bytes) lies outside the file's " +
                  std::to_string(size) + " bytes");
  if (count > cd_size / kCentralSize) bad(path, "more entries than the central directory holds");
  entries_.reserve(count);
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (!inside(at, kCentralSize, cd_end) || u32(d + at) != kCentral)
      bad(path, "central directory entry " + std::to_string(i) + " is damaged");
    const uint8_t* c = d + at;
    ZipEntry z;
    z.method = u16(c + 10);
    z.crc32 = u32(c + 16);
    z.compressed_size = u32(c + 20);
    z.size = u32(c + 24);
    const uint64_t name_len = u16(c + 28), extra_len = u16(c + 30), comment_len = u16(c + 32);
    uint64_t local = u32(c + 42);
    if (!inside(at + kCentralSize, name_len + extra_len + comment_len, cd_end))
      bad(path, "central directory entry " + std::to_string(i) + " runs past the directory");
    z.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    // Zip64 extra field (id 1): the 64-bit values of the fields that read 0xFFFFFFFF, in order.
    const uint8_t* x = c + kCentralSize + name_len;
    for (uint64_t k = 0; k + 4 <= extra_len;) {
      const uint16_t id = u16(x + k), len = u16(x + k + 2);
      if (k + 4 + len > extra_len) bad(path, "entry '" + z.name + "' has a damaged extra field");
      if (id == 1) {
        uint64_t p = k + 4;
        auto take = [&](uint64_t& field) {
          if (p + 8 > k + 4 + len) bad(path, "entry '" + z.name + "' has a short zip64 field");
          field = u64(x + p);
          p += 8;
        };
        if (z.size == 0xFFFFFFFF) take(z.size);
        if (z.compressed_size == 0xFFFFFFFF) take(z.compressed_size);
        if (local == 0xFFFFFFFF) take(local);
      }
      k += 4 + len;
    }
    if (!inside(local, kLocalSize, size) || u32(d + local) != kLocal)
      bad(path, "entry '" + z.name + "': no local header at offset " + std::to_string(local));
    z.data_offset = local + kLocalSize + u16(d + local + 26) + u16(d + local + 28);
    if (!inside(z.data_offset, z.compressed_size, size))
      bad(path, "entry '" + z.name + "' (" + std::to_string(z.compressed_size) +
                    " bytes at offset " + std::to_string(z.data_offset) +
                    ") runs past the end of the file: truncated");
    if (z.method != 0 && z.method != 8)
      bad(path, "entry '" + z.name + "' uses compression method " + std::to_string(z.method) +
                    " (only stored and deflate are read)");
    if (z.method == 0 && z.size != z.compressed_size)
      bad(path, "stored entry '" + z.name + "' has two different sizes");
    entries_.push_back(std::move(z));
    at += kCentralSize + name_len + extra_len + comment_len;
  }
}

ZipReader::~ZipReader() = default;

const ZipEntry* ZipReader::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::string ZipReader::read(const std::string& name) const {
  const ZipEntry* e = find(name);
  if (!e) throw DataError(path_, "the archive has no entry '" + name + "'");
  if (e->size > (uint64_t(1) << 31))
    throw DataError(path_, "entry '" + name + "' is " + std::to_string(e->size) +
                               " bytes, too large for a text record");
  std::string out(e->size, '\0');
  read_into(*e, out.data());
  return out;
}

void ZipReader::read_into(const ZipEntry& e, void* dst) const {
  const uint8_t* src = file_->data() + e.data_offset;
  if (e.method == 0) {
    std::memcpy(dst, src, e.size);
  } else {
    z_stream s{};
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) throw RuntimeError(path_, "zlib inflateInit failed");
    uint64_t in_left = e.compressed_size, out_left = e.size;
    s.next_in = const_cast<Bytef*>(src);
    s.next_out = static_cast<Bytef*>(dst);
    int rc = Z_OK;
    for (;;) {  // zlib's counters are 32-bit: hand it at most 1 GiB at a time
      if (s.avail_in == 0) in_left -= (s.avail_in = uInt(std::min<uint64_t>(in_left, 1u << 30)));
      if (s.avail_out == 0)
        out_left -= (s.avail_out = uInt(std::min<uint64_t>(out_left, 1u << 30)));
      rc = inflate(&s, Z_NO_FLUSH);
      if (rc != Z_OK) break;
      // Input used up, or the output full, and the stream has not ended: the sizes lie.
      if ((s.avail_in == 0 && in_left == 0) || (s.avail_out == 0 && out_left == 0)) {
        rc = Z_DATA_ERROR;
        break;
      }
    }
    const bool whole = rc == Z_STREAM_END && s.avail_out == 0 && out_left == 0;
    inflateEnd(&s);
    if (!whole)
      throw DataError(path_,
                      "entry '" + e.name + "' does not inflate to its " + std::to_string(e.size) +
                          " bytes: damaged",
                      "save the archive again");
  }
  // crc32_z takes a size_t length (zlib 1.2.9+), so entries past 4 GiB are checked whole.
  const uLong crc = crc32_z(0L, static_cast<const Bytef*>(dst), size_t(e.size));
  if (uint32_t(crc) != e.crc32)
    throw DataError(path_, "entry '" + e.name + "' fails its CRC-32 check: the file is damaged",
                    "copy or save the archive again");
}

}  // namespace mltrain::formats
