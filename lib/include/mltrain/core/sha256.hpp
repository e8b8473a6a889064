#pragma once
// SHA-256 (FIPS 180-4) for checkpoint manifests and chunk sets, computed by OpenSSL's libcrypto.
//   Sha256 h; h.update(data, n); std::string hex = h.hex();   sha256_file("model.safetensors")
#include <cstddef>
#include <cstdint>
#include <string>

namespace mltrain {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  std::string hex();  // finalises

 private:
  void* ctx_;  // EVP_MD_CTX, kept out of this header
};

std::string sha256_hex(const std::string& bytes);
std::string sha256_file(const std::string& path);  // throws CheckpointError when unreadable

}  // namespace mltrain
