#include "ferry/tcp/tcp_transport.h"

#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/tcp/congestion.h"
#include "ferry/tcp/tcp_channel.h"

namespace ferry::tcp {

TcpTransport::TcpTransport(const TcpOptions& options)
    : chunk_bytes_(options.chunk_bytes ? options.chunk_bytes : (1u << 20)),
      congestion_(options.congestion) {}

TransportInfo TcpTransport::local_info() const {
  TransportInfo info;
  info.name = kTransportName;
  info.devices = {"cpu"};
  info.priority = 10;
  return info;
}

void TcpTransport::async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) {
  auto chunk = chunk_bytes_;
  link->async_open_side_connection(
      kTransportName, [link, done = std::move(done), chunk, congestion = congestion_](
                          std::error_code ec, boost::asio::ip::tcp::socket socket) {
        if (ec) return done(ec, nullptr);
        tune_congestion(socket.native_handle(), congestion);
        std::shared_ptr<TcpChannel> channel;
        try {
          channel = std::make_shared<TcpChannel>(link, std::move(socket), chunk);
          channel->start();
        } catch (const std::bad_alloc&) {
          // `done` runs once whatever happens: the fetches waiting for this channel fail.
          return done(errc::resource_exhausted, nullptr);
        }
        done({}, channel);
      });
}

std::error_code TcpTransport::accept_side_connection(std::shared_ptr<PeerLink> link,
                                                     boost::asio::ip::tcp::socket socket,
                                                     std::shared_ptr<TransportChannel>& channel) {
  tune_congestion(socket.native_handle(), congestion_);
  auto ch = std::make_shared<TcpChannel>(link, std::move(socket), chunk_bytes_);
  ch->start();
  channel = ch;
  return {};
}

void TcpTransport::on_transport_message(PeerLink& link, uint64_t request_id,
                                        std::string_view payload) {
  if (!payload.empty()) {
    FERRY_LOG_WARN("TCP: unknown control message from peer '{}'", link.info().name);
    return;
  }
  // An acknowledgement with no channel: the send it answers failed when its connection broke.
  link.settle(request_id);
}

void TcpTransport::garbage_collect(const StoredObject&) {
  // The TCP transport holds nothing per object; the store frees the memory after this returns.
  ++collected_;
}

bool register_tcp_transport() {
  static const bool registered = [] {
    auto ec = register_transport<TcpOptions>(
        kTransportName, {"cpu"},
        [](const TransportEnv&,
           const TcpOptions& options) -> Result<std::shared_ptr<TransportManager>> {
          return std::shared_ptr<TransportManager>(std::make_shared<TcpTransport>(options));
        },
        &TcpOptions::from_environment);
    return !ec || ec == errc::transport_duplicate;
  }();
  return registered;
}

}  // namespace ferry::tcp
