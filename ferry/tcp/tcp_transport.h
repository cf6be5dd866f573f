/// @file
/// TcpTransport: the two-sided fallback. Each peer gets a second TCP connection (the data
/// channel) so bulk bytes never delay control messages; the owner streams chunks of the requests
/// it serves, oldest first with short ones ahead, and the fetcher receives them straight into
/// the targets.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "ferry/net/registry.h"
#include "ferry/net/transport.h"
#include "ferry/tcp/options.h"

/// The built-in TCP transport (the two-sided data channel) and its chunk header.
namespace ferry::tcp {

/// The name TcpTransport registers under.
inline constexpr const char* kTransportName = "TCP";

/// The TCP transport (see this file's comment): two-sided, combines as bytes arrive, aborts at
/// once. Contexts make one each through the registry (register_tcp_transport); applications do not
/// construct it. The TransportManager contract holds for every method.
class TcpTransport final : public TransportManager {
 public:
  /// Takes the chunk size (1 MiB when 0) and the congestion control from `options`; opens nothing
  /// until a peer needs a data channel.
  explicit TcpTransport(const TcpOptions& options);

  std::string name() const override { return kTransportName; }
  bool is_one_sided() const override { return false; }
  bool combines() const override { return true; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override;

  void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) override;
  std::error_code accept_side_connection(std::shared_ptr<PeerLink> link,
                                         boost::asio::ip::tcp::socket socket,
                                         std::shared_ptr<TransportChannel>& channel) override;
  /// The fetcher's acknowledgement of a send that asked for one (an empty payload), when the peer
  /// has no TCP channel any more: the send it answers failed with its connection, so the object
  /// counts it as served now (PeerLink::settle). The channel takes the others.
  void on_transport_message(PeerLink& link, uint64_t request_id, std::string_view payload) override;
  void garbage_collect(const StoredObject& object) override;

  /// Objects collected so far (for tests and `ferry serve` statistics).
  uint64_t collected() const { return collected_.load(); }

 private:
  size_t chunk_bytes_;
  std::string congestion_;  // TcpOptions::congestion (ferry/tcp/congestion.h)
  std::atomic<uint64_t> collected_{0};
};

/// Registers "TCP" with the process-wide registry, with its options (TcpOptions and
/// TcpOptions::from_environment). Idempotent; returns true once registered.
bool register_tcp_transport();

}  // namespace ferry::tcp
