// SessionLink: what the pieces of a peer session (FetchTable, ServeTable) need of the session
// that owns them, and nothing more (internal). The pieces depend on this interface, never on
// Session: each can be driven by a fake link in a unit test, without sockets.
//
// Thread model: every method is called on the peer strand (the one PeerLink::strand() names),
// and every callback a method takes runs there too.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/transport.h"

namespace ferry {

class SessionLink {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~SessionLink() = default;

  // The session as the transports see it: what a piece passes to TransportManager calls, and
  // where it reads the peer's description (info()) and installed channels (channel()). Valid
  // while the session lives.
  virtual PeerLink& peer() = 0;
  // Whether the session is open: the handshake is done and it is neither draining nor closed.
  // New work starts only while it is.
  virtual bool is_open() const = 0;
  // Why the session ended; empty while it has not.
  virtual std::error_code close_reason() const = 0;
  // The clock every deadline is measured on.
  virtual Clock::time_point now() const = 0;

  // Runs `fn` later on the strand (never inline), the session kept alive until it has run.
  virtual void post(std::function<void()> fn) = 0;
  // Queues a frame for the peer. Dropped once the session is draining or closed.
  virtual void send(const wire::Envelope& env) = 0;
  // Sends an Error frame for request `rid`. With `fatal`, the session closes once it is out.
  virtual void send_error(uint64_t rid, std::error_code ec, const std::string& message,
                          bool fatal) = 0;
  // A new request id of this side's parity (odd on the connecting side, even on the accepting
  // one), never used before on this session.
  virtual uint64_t next_request_id() = 0;
  // Asks for on_deadline-style expiry (the owner calls the pieces' expire()) no later than `at`.
  // A later `at` than one already armed changes nothing.
  virtual void arm_deadline(Clock::time_point at) = 0;

  // The transport for a request: `requested` (a name or "auto"/""), else `ref_transport` when
  // both sides have it, else the best both sides have. Null with `ec` set (transport_unknown,
  // transport_unavailable) when there is none.
  virtual std::shared_ptr<TransportManager> pick_transport(const std::string& requested,
                                                           const std::string& ref_transport,
                                                           std::error_code& ec) const = 0;
  // The best transport both sides have other than `failed`, or null.
  virtual std::shared_ptr<TransportManager> fallback_transport(
      const TransportManager& failed) const = 0;
  // Makes sure `transport` has a data channel to the peer (opening one if this side may):
  // `done` runs once, inline when the channel exists, else when it opened or could not be
  // (with that error, or the session's close reason).
  virtual void ensure_channel(const std::shared_ptr<TransportManager>& transport,
                              std::function<void(std::error_code)> done) = 0;
  // A fetch has completed: a draining session may close now.
  virtual void fetch_completed() = 0;

  // The object put under `name`, or 0 after registering to hear of it (the owner then calls
  // ServeTable::on_named). Any number of waits per name.
  virtual ObjectId wait_for_name(const std::string& name) = 0;
  // Forgets one wait for `name` registered by wait_for_name().
  virtual void forget_name_wait(const std::string& name) = 0;
};

}  // namespace ferry
