// SHA-256 through OpenSSL's libcrypto (Debian's libssl-dev): its assembly uses the SHA extensions
// or AVX2 where the CPU has them, several times the speed of a portable C++ loop.
#include "mltrain/core/sha256.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <stdexcept>
#include <vector>

#include "mltrain/core/error.hpp"

namespace mltrain {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("libcrypto: SHA-256 unavailable");
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len);
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) out += {digits[md[i] >> 4], digits[md[i] & 15]};
  return out;
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw CheckpointError(path, "cannot open for checksum");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  std::fclose(f);
  return h.hex();
}

}  // namespace mltrain
