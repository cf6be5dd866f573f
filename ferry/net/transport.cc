#include "ferry/net/transport.h"

#include "ferry/net/errors.h"

namespace ferry {

const TransportInfo* PeerInfo::find_transport(std::string_view name) const {
  for (const auto& t : transports) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

bool TransportManager::peer_has_transport(const PeerInfo& peer) const {
  return peer.find_transport(name()) != nullptr;
}

std::error_code TransportManager::extract_metadata(const StoredObject&, TransportMetadata&) {
  return {};
}

std::error_code TransportManager::accept_side_connection(std::shared_ptr<PeerLink>,
                                                         boost::asio::ip::tcp::socket,
                                                         std::shared_ptr<TransportChannel>&) {
  return errc::transport_unavailable;
}

std::error_code TransportManager::wait_fetch_complete(const FetchRequest& request,
                                                      std::chrono::milliseconds timeout) {
  return request.wait(timeout);
}

void TransportManager::on_transport_message(PeerLink&, uint64_t, std::string_view) {}

void TransportManager::when_quiet(PeerLink&, std::function<void()> then) { then(); }

Result<FetchRequest> TransportChannel::fetch_multiple(const FetchOp&) {
  return make_error_code(errc::invalid_argument);  // two-sided channels receive: recv_multiple()
}

Result<FetchRequest> TransportChannel::recv_multiple(const FetchOp&) {
  return make_error_code(errc::invalid_argument);  // one-sided channels pull: fetch_multiple()
}

bool TransportChannel::on_message(uint64_t, std::string_view) { return false; }

void fail_peer(const std::weak_ptr<PeerLink>& link, TransportChannel& channel, std::error_code ec) {
  if (auto l = link.lock()) {
    l->fail(ec);
  } else {
    channel.close(ec);
  }
}

}  // namespace ferry
