#include "ferry/net/security/tls.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#include "ferry/net/errors.h"
#include "ferry/net/system/env.h"

namespace ferry {
namespace ssl = boost::asio::ssl;

namespace {

// A file the options name must be readable; OpenSSL alone would say only "system lib".
void check_readable(const std::string& path, const char* what, const char* variable) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    throw std::system_error(make_error_code(errc::invalid_argument),
                            std::string("TLS: the ") + what + " file '" + path + "' (" + variable +
                                ") cannot be read: " + std::strerror(err));
  }
  std::fclose(f);
}

void check(const boost::system::error_code& ec, const std::string& what) {
  if (ec) {
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "TLS: " + what + ": " + ec.message());
  }
}

std::shared_ptr<ssl::context> make(ssl::context::method method, const TlsOptions& o, bool server) {
  auto ctx = std::make_shared<ssl::context>(method);
  boost::system::error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                   ec);
  check(ec, "options");
  if (!o.certificate.empty()) {
    check_readable(o.certificate, "certificate", "FERRY_TLS_CERT, TlsOptions::certificate");
    check_readable(o.private_key, "private key", "FERRY_TLS_KEY, TlsOptions::private_key");
    ctx->use_certificate_chain_file(o.certificate, ec);
    check(ec, "certificate " + o.certificate);
    ctx->use_private_key_file(o.private_key, ssl::context::pem, ec);
    check(ec, "private key " + o.private_key);
  }
  if (!o.ca.empty()) {
    check_readable(o.ca, "CA", "FERRY_TLS_CA, TlsOptions::ca");
    ctx->load_verify_file(o.ca, ec);
    check(ec, "CA file " + o.ca);
    // A client always verifies the server; a server with a CA requires client certificates.
    ctx->set_verify_mode(
        server ? ssl::verify_peer | ssl::verify_fail_if_no_peer_cert : ssl::verify_peer, ec);
    check(ec, "verify mode");
  }
  return ctx;
}

}  // namespace

bool TlsOptions::enabled() const {
  return !certificate.empty() || !private_key.empty() || !ca.empty();
}

TlsOptions TlsOptions::from_environment() {
  return {env_text("FERRY_TLS_CERT"), env_text("FERRY_TLS_KEY"), env_text("FERRY_TLS_CA")};
}

TlsContexts make_tls_contexts(const TlsOptions& o) {
  TlsContexts out;
  if (!o.enabled()) return out;
  if (o.certificate.empty() != o.private_key.empty()) {
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "TLS: a certificate needs its private key, and a key its certificate");
  }
  if (!o.certificate.empty()) out.server = make(ssl::context::tls_server, o, true);
  if (!o.ca.empty()) out.client = make(ssl::context::tls_client, o, false);
  return out;
}

}  // namespace ferry
