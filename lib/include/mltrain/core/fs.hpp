#pragma once
// File primitives every writer in mltrain uses: atomic replacement and read-only mappings.
//
//   AtomicFile f("runs/x/checkpoints/latest");   // writes "<path>.tmp.<pid>" beside it
//   f.write("step_400\n");
//   f.commit();        // fsync(file), rename over <path>, fsync(dir): all or nothing
//
//   MappedFile m("data/train.shard");   // PROT_READ mmap; m.data(), m.size()
//
//   remove_tree("runs/x/checkpoints/step_400");   // rm -r, without std::filesystem::remove_all
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

namespace mltrain {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // an uncommitted file is removed
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_, name_;
  int fd_ = -1;
  bool torn_ =
      false;  // MLTRAIN_FAULT=write:<name>: the first write stops half-way (core/fault.hpp)
};

void write_file_atomic(const std::string& path, const std::string& content);
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);  // throws DataError when unreadable

// Removes `path` and everything below it, symlinks as links (never followed); a missing path is
// not an error. Returns how many entries went. Throws std::filesystem::filesystem_error, or with
// `ec` sets it and stops. Use this, never std::filesystem::remove_all: pip LibTorch 2.x's
// libtorch.so exports a copy of remove_all of its own, the dynamic linker binds mltrain's calls to
// it, and on a non-empty folder it calls address 0 (LibTorch 2.11 + GCC 13, measured 2026-12-04:
// every run that pruned a checkpoint died with SIGSEGV). The wheel links libstdc++'s
// std::filesystem statically and exports it (pytorch/pytorch#133437); the rest of it has worked.
std::uintmax_t remove_tree(const std::filesystem::path& path);
std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec);

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws DataError
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mltrain
