#pragma once
// The zip container of PyTorch's archives (torch.export's .pt2, torch.save's .pt): the central
// directory read from a read-only mapping, entries stored (what PyTorchStreamWriter writes) or
// deflated (a user's re-zip), zip64 for archives past 4 GiB. Every offset and size is checked
// against the file before it is used, and an entry's CRC-32 against its bytes when read.
//
//   formats::ZipReader zip("model.pt2");                 // DataError naming the file if not a zip
//   for (const auto& e : zip.entries()) ...               // e.name, e.size
//   std::string json = zip.read("model/models/model.json");
//   zip.read_into(*zip.find("model/data/weights/weight_0"), dst, nbytes);
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mltrain {
class MappedFile;
}

namespace mltrain::formats {

struct ZipEntry {
  std::string name;
  uint64_t size = 0;  // uncompressed bytes
  uint64_t compressed_size = 0;
  uint64_t data_offset = 0;  // where its (compressed) bytes start in the file
  uint16_t method = 0;       // 0 stored, 8 deflate
  uint32_t crc32 = 0;
};

class ZipReader {
 public:
  explicit ZipReader(const std::string& path);  // throws DataError naming the path
  ~ZipReader();
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;  // nullptr when absent
  std::string read(const std::string& name) const;      // DataError when absent or damaged
  // Copies the entry's uncompressed bytes to dst, which holds entry.size bytes.
  void read_into(const ZipEntry& entry, void* dst) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  std::vector<ZipEntry> entries_;
};

}  // namespace mltrain::formats
