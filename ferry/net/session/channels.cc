#include "ferry/net/session/channels.h"

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry {

Channels::Channels(PeerLink& peer) : peer_(peer) {}

std::shared_ptr<TransportChannel> Channels::find(std::string_view transport) const {
  auto it = slots_.find(std::string(transport));
  return it == slots_.end() ? nullptr : it->second.channel;
}

void Channels::ensure(const std::shared_ptr<TransportManager>& transport,
                      std::function<void(std::error_code)> done) {
  auto& slot = slots_[transport->name()];
  if (slot.channel) {
    done({});
    return;
  }
  slot.waiters.push_back(std::move(done));
  if (slot.opening) return;
  if (!peer_.info().initiator) {
    // Channels are opened by the side that connected; it did so for the negotiated transport.
    auto waiters = std::move(slot.waiters);
    slots_.erase(transport->name());
    for (auto& w : waiters) w(errc::transport_unavailable);
    return;
  }
  slot.opening = true;
  // The session, which owns this table, lives until the transport has called back.
  try {
    open(transport);
  } catch (...) {
    // Nothing was started: forget the open and its one waiter (the caller hears of the
    // exception), so that the next ensure() opens again instead of queuing behind it for good.
    slots_.erase(transport->name());
    throw;
  }
}

void Channels::open(const std::shared_ptr<TransportManager>& transport) {
  transport->async_open_channel(peer_.shared_link(),
                                [keep = peer_.shared_link(), this, name = transport->name()](
                                    std::error_code ec, std::shared_ptr<TransportChannel> ch) {
                                  auto& slot = slots_[name];
                                  auto waiters = std::move(slot.waiters);
                                  slot.opening = false;
                                  if (!ec && closed_) {
                                    ch->close(closed_);
                                    ec = closed_;
                                  }
                                  if (ec) {
                                    slots_.erase(name);
                                  } else {
                                    slot.channel = std::move(ch);
                                  }
                                  for (auto& w : waiters) w(ec);
                                });
}

bool Channels::install(std::string_view transport, std::shared_ptr<TransportChannel> channel) {
  auto& slot = slots_[std::string(transport)];
  if (slot.channel || closed_) return false;
  slot.channel = std::move(channel);
  auto waiters = std::move(slot.waiters);
  slot.opening = false;
  for (auto& w : waiters) w({});
  return true;
}

void Channels::drop(std::string_view transport, std::error_code ec) {
  auto it = slots_.find(std::string(transport));
  if (it == slots_.end() || !it->second.channel) return;
  auto channel = std::move(it->second.channel);
  slots_.erase(it);
  FERRY_LOG_WARN("peer '{}': {} channel dropped: {}", peer_.info().name, transport, ec.message());
  channel->close(ec);
}

void Channels::close(std::error_code reason) {
  closed_ = reason;
  auto slots = std::move(slots_);
  slots_.clear();
  for (auto& [name, slot] : slots) {
    if (slot.channel) slot.channel->close(reason);
    for (auto& w : slot.waiters) w(reason);
  }
}

}  // namespace ferry
