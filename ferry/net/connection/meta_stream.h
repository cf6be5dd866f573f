// MetaStream: the byte stream under a metadata connection: plain TCP, or TLS over it
// (ContextOptions::tls). Internal. Data channels never use it: they stay plain TCP or RDMA.
// Not thread-safe: one read and one write outstanding at a time, from one strand.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <memory>
#include <optional>
#include <utility>

namespace ferry {

class MetaStream {
 public:
  using tcp = boost::asio::ip::tcp;
  using TlsStream = boost::asio::ssl::stream<tcp::socket>;

  explicit MetaStream(tcp::socket socket) : plain_(std::move(socket)) {}

  // Moves the socket under a TLS stream of `ctx` (before any byte is exchanged). The caller
  // then runs tls().async_handshake.
  void start_tls(boost::asio::ssl::context& ctx) {
    tls_ = std::make_unique<TlsStream>(std::move(*plain_), ctx);
    plain_.reset();
  }
  bool is_tls() const { return tls_ != nullptr; }
  TlsStream& tls() { return *tls_; }
  tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  // The plain socket (a connection that is not TLS); the stream is empty afterwards.
  tcp::socket release_plain() { return std::move(*plain_); }

  // Each operation takes a handler or a completion token (asio::use_awaitable, ...) and returns
  // what the stream's own operation returns for it.
  template <typename Buffers, typename Handler>
  auto async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) return tls_->async_read_some(buffers, std::forward<Handler>(handler));
    return plain_->async_read_some(buffers, std::forward<Handler>(handler));
  }
  // Exactly the buffers' size.
  template <typename Buffers, typename Handler>
  auto async_read(const Buffers& buffers, Handler&& handler) {
    if (tls_) return boost::asio::async_read(*tls_, buffers, std::forward<Handler>(handler));
    return boost::asio::async_read(*plain_, buffers, std::forward<Handler>(handler));
  }
  template <typename Buffers, typename Handler>
  auto async_write(const Buffers& buffers, Handler&& handler) {
    if (tls_) return boost::asio::async_write(*tls_, buffers, std::forward<Handler>(handler));
    return boost::asio::async_write(*plain_, buffers, std::forward<Handler>(handler));
  }
  // Shuts the connection down and closes it (no TLS close_notify: the peer sees the reset and
  // the framing makes truncation visible). Pending operations complete with an error.
  void close() {
    boost::system::error_code ignored;
    socket().shutdown(tcp::socket::shutdown_both, ignored);
    socket().close(ignored);
  }

 private:
  std::optional<tcp::socket> plain_;
  std::unique_ptr<TlsStream> tls_;
};

}  // namespace ferry
