// Channels: the transports' data channels to one peer (internal). A fetch over a transport
// waits here for that transport's channel: the side that connected opens it, the other side
// has it installed by its transport (or by a side connection the peer opened). A broken
// channel is dropped and the next fetch opens a new one.
//
// Thread model: every method runs on the peer strand, and every callback it takes runs there
// too. It depends only on the PeerLink the transports are handed, never on Session.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "ferry/net/transport.h"

namespace ferry {

class Channels {
 public:
  // `peer` (the session, as the transports see it) outlives the table.
  explicit Channels(PeerLink& peer);
  Channels(const Channels&) = delete;
  Channels& operator=(const Channels&) = delete;

  // The channel installed for `transport`, or null (none, or still opening).
  std::shared_ptr<TransportChannel> find(std::string_view transport) const;
  // Makes sure `transport` has a channel: `done` runs once, inline when it exists; otherwise
  // the side that connected opens one (one open at a time per transport, however many wait)
  // and `done` runs with its outcome, or with the close reason when close() comes first. On
  // the accepting side, which opens none, `done` runs inline with errc::transport_unavailable.
  // When the transport's open throws (std::bad_alloc), so does ensure(), and `done` never runs;
  // the next ensure() opens again.
  void ensure(const std::shared_ptr<TransportManager>& transport,
              std::function<void(std::error_code)> done);
  // PeerLink::install_channel: installs `channel` for `transport` and runs what waited for it.
  // False (and nothing changes) when one is installed already or the table is closed.
  bool install(std::string_view transport, std::shared_ptr<TransportChannel> channel);
  // PeerLink::drop_channel: forgets `transport`'s channel and closes it with `ec`.
  void drop(std::string_view transport, std::error_code ec);
  // The session ended: closes every channel with `reason` and fails what waits with it; a
  // channel that opens later is closed at once.
  void close(std::error_code reason);

 private:
  // Starts opening `transport`'s channel (its slot is marked opening); its callback runs the
  // slot's waiters.
  void open(const std::shared_ptr<TransportManager>& transport);

  struct Slot {
    std::shared_ptr<TransportChannel> channel;
    bool opening = false;
    std::vector<std::function<void(std::error_code)>> waiters;
  };

  PeerLink& peer_;
  std::unordered_map<std::string, Slot> slots_;
  std::error_code closed_;  // the close reason once close() ran
};

}  // namespace ferry
