// TLS contexts for the metadata channel, made from ContextOptions::tls. Internal.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "ferry/net/context.h"

namespace ferry {

struct TlsContexts {
  std::shared_ptr<boost::asio::ssl::context> client;  // null: TLS off, or no CA to verify with
  std::shared_ptr<boost::asio::ssl::context> server;  // null: TLS off, or no certificate
};

// Loads the certificate, key and CA files (TLS 1.2 and later). Throws std::system_error
// (errc::invalid_argument, with OpenSSL's reason) when a configured file cannot be used.
TlsContexts make_tls_contexts(const TlsOptions& options);

// The first byte of a TLS record carrying a handshake (a ClientHello). No ferry frame starts
// with it: it would announce a body of more than 350 MB.
inline constexpr unsigned char kTlsHandshakeByte = 0x16;

}  // namespace ferry
