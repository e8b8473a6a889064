#pragma once
// SHA-256 (FIPS 180-4), for checkpoint manifests.
//   Sha256 h; h.update(data, n); std::string hex = h.hex();   sha256_file("model.safetensors")
#include <cstddef>
#include <cstdint>
#include <string>

namespace mltrain {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // finalises

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const std::string& bytes);
std::string sha256_file(const std::string& path);  // throws CheckpointError when unreadable

}  // namespace mltrain
