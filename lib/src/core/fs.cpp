#include "mltrain/core/fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"

namespace mltrain {

static std::string errno_text() { return std::strerror(errno); }

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  name_ = std::filesystem::path(path_).filename().string();
  torn_ = fault::enabled() && fault::armed("write:" + name_);  // the first write stops half-way
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw RuntimeError(tmp_, "cannot create: " + errno_text(),
                       "check the folder exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  if (torn_) {
    if (n / 2 > 0 && ::write(fd_, p, n / 2) < 0) fault::die();
    fault::die();
  }
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(tmp_, "write failed: " + errno_text(), "check free disk space");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (fault::enabled()) fault::at("fsync:" + name_);
  if (::fsync(fd_) != 0)
    throw RuntimeError(tmp_, "fsync failed: " + errno_text(), "check free disk space");
  if (::close(fd_) != 0) {  // NFS and full disks report a failed write-back here
    fd_ = -1;
    ::unlink(tmp_.c_str());
    throw RuntimeError(tmp_, "close failed: " + errno_text(), "check free disk space");
  }
  fd_ = -1;
  if (fault::enabled()) fault::at("rename:" + name_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    throw RuntimeError(path_, "rename failed: " + errno_text());
  }
  if (fault::enabled()) fault::at("dirsync:" + name_);
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {
// Removes the entries of the open folder `dir_fd` (then closed), depth first; errno-style result.
int remove_below(int dir_fd, std::uintmax_t& count) {
  DIR* d = ::fdopendir(dir_fd);
  if (!d) {
    const int e = errno;
    ::close(dir_fd);
    return e;
  }
  int err = 0;
  while (err == 0) {
    errno = 0;
    const dirent* ent = ::readdir(d);
    if (!ent) {
      err = errno;
      break;
    }
    const char* name = ent->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    struct stat st;
    if (::fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) err = errno;  // gone meanwhile: fine
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      const int sub = ::openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) {
        err = errno;
        break;
      }
      if ((err = remove_below(sub, count)) != 0) break;
    }
    if (::unlinkat(dirfd(d), name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0) {
      if (errno != ENOENT) err = errno;
      continue;
    }
    ++count;
  }
  ::closedir(d);
  return err;
}
}  // namespace

std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  std::uintmax_t count = 0;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return 0;
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = fd < 0 ? errno : remove_below(fd, count);
    if (err != 0) {
      ec.assign(err, std::generic_category());
      return count;
    }
  }
  if ((S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str())) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return count;
  }
  return count + 1;
}

std::uintmax_t remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t n = remove_tree(path, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove", path, ec);
  return n;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open: " + errno_text(), "check the path and permissions");
  // Sized from the file and read in place: a stringstream doubled and copied a 130 MB CSV 4 times.
  std::string out;
  std::error_code ec;
  const auto size =
      std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  if (!ec && size > 0) out.resize(static_cast<size_t>(size));
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(in.gcount()));
  char buf[65536];  // what a pipe, or a file that grew, holds beyond that
  while (in.read(buf, sizeof buf) || in.gcount() > 0)
    out.append(buf, static_cast<size_t>(in.gcount()));
  if (in.bad()) throw DataError(path, "read failed: " + errno_text(), "check the disk");
  return out;
}

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(path, "cannot open: " + errno_text(), "check the path and permissions");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(path, "cannot stat: " + errno_text());
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw DataError(path, "mmap failed: " + errno_text());
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace mltrain
