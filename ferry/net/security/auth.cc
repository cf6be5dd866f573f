#include "ferry/net/security/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <random>

namespace ferry::auth {

void init() { OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr); }

std::string nonce() {
  std::string n(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    std::random_device rd;  // OpenSSL's generator failed: still unpredictable enough per run
    for (auto& c : n) c = static_cast<char>(rd());
  }
  return n;
}

std::string proof(std::string_view secret, std::string_view label, std::string_view a,
                  std::string_view b) {
  std::string message;
  message.reserve(label.size() + a.size() + b.size());
  message.append(label).append(a).append(b);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ferry::auth
