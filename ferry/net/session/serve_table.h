// ServeTable: the requests one peer has this side serve (internal). It checks each Fetch
// against the store and the limits, parks fetches by name until the name is put (or their wait
// ends), hands the pinned object to the transport, aborts serves on the owner's word or the
// fetcher's Cancel, and keeps the serves that failed here while the fetcher may still have every
// byte until the fetcher settles them.
//
// Thread model: every method runs on the peer strand. It depends only on SessionLink, the store
// and the stats.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "ferry/net/session/session_link.h"
#include "ferry/net/stats.h"
#include "ferry/store/object_store.h"

namespace ferry {

class ServeTable {
 public:
  using Clock = SessionLink::Clock;

  // This side's part of every serve decision (ContextOptions and the Context's instance).
  struct Options {
    std::string owner_name;       // this side's name, in the errors the peer reads
    uint64_t owner_instance = 0;  // refs from another instance of this owner are stale
    size_t max_requests = 4096;   // serves and parked fetches at once; unsettled ones kept
    std::chrono::milliseconds lease_timeout{60000};  // the longest a fetch waits for a name
    // What the fetches waiting for a name may hold (each a copy of its Fetch, and of its name
    // for the wait): more get errc::overloaded. A serve holds a pin, never a copy.
    size_t max_parked_bytes = 16u << 20;
  };

  // `link`, `store` and `stats` outlive the table.
  ServeTable(SessionLink& link, ObjectStore& store, detail::StatsRecorder& stats, Options options);
  ServeTable(const ServeTable&) = delete;
  ServeTable& operator=(const ServeTable&) = delete;

  // The peer's Fetch `rid`: serves it over the transport it asks for (its channel's
  // send_multiple, which holds the pin until its done), parks it when it names an object not
  // put yet, or refuses it (an Error frame for `rid`, counted in the stats): invalid_argument
  // (an id in use or of this side's parity), overloaded (max_requests), stale_ref,
  // object_not_found, size_mismatch, transport_unknown / transport_unavailable. A serve's end is
  // counted in the stats; it runs the object's hooks on success and reports a failure to the peer
  // (the hooks then wait for settle()) unless it was aborted or the session ended.
  void serve(uint64_t rid, const wire::Fetch& msg);
  // An object was put under `name`: serves the fetches parked for it, while the session is open.
  void on_named(const std::string& name);
  // The peer's Cancel of `rid`: a parked fetch is forgotten, a serve is aborted at its channel
  // (its end follows through send_multiple's done). Unknown ids are ignored.
  void cancel(uint64_t rid);
  // The owner aborts every serve of `object`: each fails at the fetcher with errc::aborted; a
  // two-sided transport stops at once, a one-sided one keeps its grant until the fetcher's
  // Cancel or the lease ends.
  void abort_object(ObjectId object);
  // PeerLink::settle: the fetcher has every byte of `rid`, whose serve failed here: runs the
  // object's hooks now. Unknown ids are ignored.
  void settle(uint64_t rid);

  // Ends every parked fetch whose wait ends at or before `now`: errc::timed_out to the peer
  // while the session is open.
  void expire(Clock::time_point now);
  // The earliest end of a parked fetch's wait; Clock::time_point::max() when none is parked.
  Clock::time_point next_deadline() const;
  // The session ended: forgets every parked fetch, serve and unsettled one without a word to the
  // peer (the transports end their serves when their channels close).
  void close();

  size_t serving() const { return serving_.size(); }
  size_t parked() const { return parked_.size(); }
  size_t unsettled() const { return unsettled_.size(); }

 private:
  // A served object's hooks (PutOptions::on_sent, on_served), run in that order.
  struct ServeHooks {
    std::function<void()> sent, served;
    explicit operator bool() const { return sent || served; }
    void operator()() const {
      if (sent) sent();
      if (served) served();
    }
  };
  // A fetch by name that arrived before the name was put (ObjectRef::named).
  struct Parked {
    wire::Fetch msg;
    Clock::time_point deadline;
    size_t bytes = 0;  // what it holds, counted in parked_bytes_
  };
  // Forgets parked fetch `it` (its bytes too); the next one.
  std::unordered_map<uint64_t, Parked>::iterator unpark(
      std::unordered_map<uint64_t, Parked>::iterator it);
  // A serve in flight: the transport moving it, the object, whether abort_object() ended it.
  struct Serving {
    std::shared_ptr<TransportManager> transport;
    ObjectId object = 0;
    bool aborted = false;
  };

  // A request this side will not serve: counted in the stats and answered with the error.
  void refuse(uint64_t rid, std::error_code ec, const std::string& text);

  SessionLink& link_;
  ObjectStore& store_;
  detail::StatsRecorder& stats_;
  const Options options_;
  std::unordered_map<uint64_t, Serving> serving_;
  // Serves of objects that count them which failed on this side while the peer lives: the
  // fetcher may have every byte all the same, and its word (settle) counts them. At most
  // max_requests, oldest dropped first (rare: only after a channel broke).
  std::deque<std::pair<uint64_t, ServeHooks>> unsettled_;
  std::unordered_map<uint64_t, Parked> parked_;
  size_t parked_bytes_ = 0;  // the parked fetches' bytes
};

}  // namespace ferry
