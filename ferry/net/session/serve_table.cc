#include "ferry/net/session/serve_table.h"

#include <algorithm>
#include <vector>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry {

ServeTable::ServeTable(SessionLink& link, ObjectStore& store, detail::StatsRecorder& stats,
                       Options options)
    : link_(link), store_(store), stats_(stats), options_(std::move(options)) {}

void ServeTable::refuse(uint64_t rid, std::error_code ec, const std::string& text) {
  stats_.serve_done(ec, 0, {});
  link_.send_error(rid, ec, text, false);
}

void ServeTable::serve(uint64_t rid, const wire::Fetch& msg) {
  const PeerInfo& peer = link_.peer().info();
  // The peer's ids have the other parity than ours (odd on the connecting side), and leave the
  // top bit clear (transports may tag their own work with it: RDMA's window binds do).
  const uint64_t our_parity = peer.initiator ? 1 : 0;
  if (serving_.count(rid) || parked_.count(rid) || rid % 2 == our_parity || (rid >> 63) != 0) {
    refuse(rid, errc::invalid_argument, "request id in use, or not one the peer may use");
    return;
  }
  if (serving_.size() + parked_.size() >= options_.max_requests) {
    // Bounded: a peer that floods requests (or never reads what it asked for) gets errors, not
    // an ever-growing share of this process.
    refuse(rid, errc::overloaded,
           "more than " + std::to_string(options_.max_requests) + " requests in flight");
    return;
  }
  if (msg.owner_instance() != 0 && msg.owner_instance() != options_.owner_instance) {
    refuse(rid, errc::stale_ref, "ref is from an earlier instance of this owner");
    return;
  }
  std::error_code ec;
  auto transport = link_.pick_transport(msg.transport(), {}, ec);
  if (!transport) {
    refuse(rid, ec, "transport '" + msg.transport() + "' is not available");
    return;
  }
  ObjectId id = msg.object_id();
  if (id == 0 && !msg.name().empty()) {
    id = link_.wait_for_name(msg.name());
    if (id == 0) {
      // Not put yet: wait for it, at most what the fetcher allows and our lease timeout.
      const auto wait = std::min<uint64_t>(msg.wait_ms(), options_.lease_timeout.count());
      const auto deadline = link_.now() + std::chrono::milliseconds(wait);
      const size_t bytes = msg.ByteSizeLong() + msg.name().size();
      if (parked_bytes_ + bytes > options_.max_parked_bytes) {
        link_.forget_name_wait(msg.name());
        refuse(rid, errc::overloaded,
               "fetches waiting for a name hold more than " +
                   std::to_string(options_.max_parked_bytes) + " bytes");
        return;
      }
      // Copied into an entry already in the map: protobuf's generated copy constructor leaks
      // what it made when an allocation inside it throws; CopyFrom leaves a whole message.
      auto& parked = parked_[rid];
      try {
        parked.msg.CopyFrom(msg);
      } catch (const std::bad_alloc&) {
        parked_.erase(rid);
        throw;
      }
      parked.deadline = deadline;
      parked.bytes = bytes;
      parked_bytes_ += bytes;
      link_.arm_deadline(deadline);
      FERRY_LOG_DEBUG("peer '{}': request {} waits for the name '{}'", peer.name, rid, msg.name());
      return;
    }
  }
  auto pin = store_.pin(id);
  if (!pin) {
    refuse(rid, errc::object_not_found,
           msg.name().empty()
               ? "object " + std::to_string(id) + " not found on '" + options_.owner_name + "'"
               : "object named '" + msg.name() + "' is gone from '" + options_.owner_name + "'");
    return;
  }
  if (pin.object().exclusive && pin.object().transport != transport->name()) {
    refuse(rid, errc::transport_unavailable,
           "object " + std::to_string(msg.object_id()) + " is offered only over " +
               pin.object().transport + ", not " + transport->name());
    return;
  }
  // Served over a transport other than its own: that one collects it too (it may register it).
  store_.served_over(id, transport->name());
  const auto& tensors = pin.object().tensors;
  bool sizes_ok = static_cast<size_t>(msg.sizes_size()) == tensors.size();
  for (size_t i = 0; sizes_ok && i < tensors.size(); ++i) {
    sizes_ok = msg.sizes(static_cast<int>(i)) == tensors[i].data.size();
  }
  if (!sizes_ok) {
    refuse(rid, errc::size_mismatch, "requested sizes do not match the object");
    return;
  }
  const auto channel = link_.peer().channel(transport->name());
  if (!channel) {
    refuse(rid, errc::transport_unavailable,
           "no " + transport->name() + " data channel to this peer");
    return;
  }
  serving_.emplace(rid, Serving{transport, id});
  stats_.serve_started();
  FERRY_LOG_DEBUG("peer '{}': request {} served: object {} '{}' over {}", peer.name, rid, id,
                  msg.name(), transport->name());
  ServeHooks hooks{pin.object().on_sent, pin.object().on_served};
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.data.size();
  // Ends the serve once: through the transport, or here when send_multiple ran out of memory
  // before it could call it (a copy of `done` may then still be held, and run later: a no-op).
  auto ended = std::make_shared<bool>(false);
  SendDone done = [keep = link_.peer().shared_link(), this, rid, hooks = std::move(hooks), bytes,
                   name = transport->name(), ended](std::error_code ec) {
    // The session, which owns this table, lives until the transport has called it.
    if (*ended) return;
    *ended = true;
    serving_.erase(rid);
    stats_.serve_ended(ec, bytes, name);
    if (!ec) {
      if (hooks) hooks();
      return;
    }
    if (ec == errc::aborted || !link_.is_open()) return;
    if (hooks) {  // the fetcher may confirm every byte yet (settle)
      if (unsettled_.size() >= options_.max_requests) unsettled_.pop_front();
      unsettled_.emplace_back(rid, hooks);
    }
    link_.send_error(rid, ec, "send failed", false);  // counted above, as it ended
  };
  try {
    channel->send_multiple(rid, std::move(pin), done);
  } catch (const std::bad_alloc&) {
    FERRY_LOG_WARN("peer '{}': request {}: out of memory starting the serve", peer.name, rid);
    done(errc::resource_exhausted);
  }
}

void ServeTable::settle(uint64_t rid) {
  auto it = std::find_if(unsettled_.begin(), unsettled_.end(),
                         [&](const auto& u) { return u.first == rid; });
  if (it == unsettled_.end()) return;
  auto hooks = std::move(it->second);
  unsettled_.erase(it);
  FERRY_LOG_DEBUG("peer '{}': request {} served after all (the fetcher has every byte)",
                  link_.peer().info().name, rid);
  hooks();
}

void ServeTable::on_named(const std::string& name) {
  std::vector<std::pair<uint64_t, wire::Fetch>> ready;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->second.msg.name() == name) {
      ready.emplace_back(it->first, std::move(it->second.msg));
      it = unpark(it);
    } else {
      ++it;
    }
  }
  for (auto& [rid, msg] : ready) {
    if (link_.is_open()) serve(rid, msg);
  }
}

void ServeTable::cancel(uint64_t rid) {
  if (auto parked = parked_.find(rid); parked != parked_.end()) {
    link_.forget_name_wait(parked->second.msg.name());
    unpark(parked);
    return;  // waiting for a name: nothing started
  }
  auto it = serving_.find(rid);
  if (it == serving_.end()) return;  // already finished: nothing to stop
  if (auto channel = link_.peer().channel(it->second.transport->name())) channel->abort(rid);
}

void ServeTable::abort_object(ObjectId object) {
  std::vector<uint64_t> rids;
  for (auto& [rid, serve] : serving_) {
    if (serve.object != object || serve.aborted) continue;
    serve.aborted = true;
    rids.push_back(rid);
  }
  for (uint64_t rid : rids) {
    link_.send_error(
        rid, errc::aborted,
        "owner '" + options_.owner_name + "' aborted serving object " + std::to_string(object),
        false);
    // A transport's abort may end the serve at once (its SendDone erases the entry).
    auto it = serving_.find(rid);
    if (it == serving_.end() || it->second.transport->is_one_sided()) continue;
    if (auto channel = link_.peer().channel(it->second.transport->name())) channel->abort(rid);
  }
}

void ServeTable::expire(Clock::time_point now) {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    if (link_.is_open()) {
      // The same error as the fetcher's own deadline, which this wait ends with: a name that
      // never appears fails with timed_out, whichever side's clock ends it.
      link_.send_error(it->first, errc::timed_out,
                       "no object was put under the name '" + it->second.msg.name() + "' in time",
                       false);
    }
    link_.forget_name_wait(it->second.msg.name());
    it = unpark(it);
  }
}

std::unordered_map<uint64_t, ServeTable::Parked>::iterator ServeTable::unpark(
    std::unordered_map<uint64_t, Parked>::iterator it) {
  parked_bytes_ -= it->second.bytes;
  return parked_.erase(it);
}

ServeTable::Clock::time_point ServeTable::next_deadline() const {
  auto next = Clock::time_point::max();
  for (const auto& [rid, p] : parked_) next = std::min(next, p.deadline);
  return next;
}

void ServeTable::close() {
  for (const auto& [rid, parked] : parked_) link_.forget_name_wait(parked.msg.name());
  parked_.clear();
  parked_bytes_ = 0;
  serving_.clear();
  unsettled_.clear();
}

}  // namespace ferry
