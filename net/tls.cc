#include "net/tls.h"

#include <cstdlib>
#include <string>
#include <system_error>

#include "net/env.h"
#include "net/errors.h"

namespace ferry {
namespace ssl = boost::asio::ssl;

namespace {

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
    ctx->use_certificate_chain_file(o.certificate, ec);
    check(ec, "certificate " + o.certificate);
    ctx->use_private_key_file(o.private_key, ssl::context::pem, ec);
    check(ec, "private key " + o.private_key);
  }
  if (!o.ca.empty()) {
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
