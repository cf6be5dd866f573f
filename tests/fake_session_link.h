// Fakes for the session pieces' unit tests: a SessionLink (and the PeerLink it hands the
// transports) that records what the piece asks of it, with a clock the test moves, and a
// transport whose channels record their calls in it and let the test finish them. No sockets, no io
// thread: post() queues, run_posted() runs the queue.
#pragma once

#include <boost/asio/io_context.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ferry/net/errors.h"
#include "ferry/net/session/session_link.h"

namespace ferry::fakes {

class FakeTransport;

// A channel that records what it is asked in its transport (FakeTransport); without one, only
// its close.
struct FakeChannel : TransportChannel {
  explicit FakeChannel(FakeTransport* transport = nullptr) : transport(transport) {}
  Result<FetchRequest> fetch_multiple(const FetchOp& op) override;
  Result<FetchRequest> recv_multiple(const FetchOp& op) override;
  void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) override;
  bool abort(uint64_t request_id) override;
  void close(std::error_code) override { closed = true; }
  FakeTransport* transport;
  bool closed = false;
};

class FakeTransport : public TransportManager {
 public:
  FakeTransport(std::string name, bool one_sided, bool combines = false)
      : name_(std::move(name)), one_sided_(one_sided), combines_(combines) {}

  std::string name() const override { return name_; }
  bool is_one_sided() const override { return one_sided_; }
  bool combines() const override { return combines_; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override { return {name_, {}, {}, 0}; }
  void async_open_channel(std::shared_ptr<PeerLink>, ChannelOpenHandler done) override {
    ++opens;
    if (std::exchange(open_throws, false)) throw std::bad_alloc();
    if (hold_opens) return pending_opens.push_back(std::move(done));
    done(errc::transport_unavailable, nullptr);
  }
  void garbage_collect(const StoredObject&) override {}

  // Ends serve `request_id` as the transport would (its SendDone), dropping its pin first.
  void finish_send(uint64_t request_id, std::error_code ec) {
    pins.erase(request_id);
    auto done = std::move(sends.at(request_id));
    sends.erase(request_id);
    done(ec);
  }

  std::vector<FetchOp> fetches;               // every fetch launched, in order
  std::map<uint64_t, SendDone> sends;         // serves in flight
  std::map<uint64_t, ObjectStore::Pin> pins;  // their pins
  std::vector<uint64_t> aborts;               // every abort() call of its channels
  bool abort_lets_go = true;                  // what their abort() returns
  std::error_code fail_launch;                // their fetch/recv_multiple fail with it when set
  bool send_throws = false;    // their send_multiple keeps `done`, then throws std::bad_alloc
  bool launch_throws = false;  // their fetch/recv_multiple record the fetch, then throw bad_alloc
  int opens = 0;               // async_open_channel() calls
  bool hold_opens = false;     // async_open_channel waits in `pending_opens` (else it fails)
  bool open_throws = false;    // the next async_open_channel throws std::bad_alloc
  std::vector<ChannelOpenHandler> pending_opens;

  // What its channels do with a fetch: records it, or fails it with fail_launch.
  Result<FetchRequest> take(const FetchOp& op) {
    if (fail_launch) return fail_launch;
    fetches.push_back(op);
    if (launch_throws) throw std::bad_alloc();
    return op.request;
  }

 private:
  std::string name_;
  bool one_sided_;
  bool combines_;
};

inline Result<FetchRequest> FakeChannel::fetch_multiple(const FetchOp& op) {
  return transport->take(op);
}
inline Result<FetchRequest> FakeChannel::recv_multiple(const FetchOp& op) {
  return transport->take(op);
}
inline void FakeChannel::send_multiple(uint64_t request_id, ObjectStore::Pin object,
                                       SendDone done) {
  if (transport->send_throws) {  // out of memory halfway: `done` kept, the pin let go
    transport->sends.emplace(request_id, std::move(done));
    throw std::bad_alloc();
  }
  // As a transport must: out of memory here, it holds nothing of the serve.
  const auto send = transport->sends.emplace(request_id, std::move(done)).first;
  try {
    transport->pins.emplace(request_id, std::move(object));
  } catch (const std::bad_alloc&) {
    transport->sends.erase(send);
    throw;
  }
}
inline bool FakeChannel::abort(uint64_t request_id) {
  transport->aborts.push_back(request_id);
  return transport->abort_lets_go;
}

class FakeSessionLink : public SessionLink,
                        public PeerLink,
                        public std::enable_shared_from_this<FakeSessionLink> {
 public:
  explicit FakeSessionLink(bool initiator = true)
      : strand_(boost::asio::make_strand(io_)), next_id_(initiator ? 1 : 2) {
    info_.name = "peer";
    info_.initiator = initiator;
  }

  // Transports, best first: pick_transport and fallback_transport choose among them.
  void add_transport(std::shared_ptr<FakeTransport> t, bool with_channel) {
    transports.push_back(t);
    if (with_channel) channels[t->name()] = std::make_shared<FakeChannel>(t.get());
  }
  // Runs what was posted (and what that posts), in order.
  void run_posted() {
    while (!posted.empty()) {
      auto fn = std::move(posted.front());
      posted.pop_front();
      fn();
    }
  }
  // The Error frames sent, as (request id, ferry error code).
  std::vector<std::pair<uint64_t, std::error_code>> errors() const {
    std::vector<std::pair<uint64_t, std::error_code>> out;
    for (const auto& e : error_frames) out.emplace_back(e.rid, e.ec);
    return out;
  }

  // SessionLink
  PeerLink& peer() override { return *this; }
  bool is_open() const override { return open; }
  std::error_code close_reason() const override { return reason; }
  Clock::time_point now() const override { return clock; }
  void post(std::function<void()> fn) override { posted.push_back(std::move(fn)); }
  // Copied into a message already in `sent`: a protobuf copy constructor that runs out of memory
  // halfway leaks what it made (generated code assumes no exceptions); CopyFrom leaves a whole
  // message, which pop_back frees.
  void send(const wire::Envelope& env) override {
    sent.emplace_back();
    try {
      sent.back().CopyFrom(env);
    } catch (const std::bad_alloc&) {
      sent.pop_back();
      throw;
    }
  }
  void send_error(uint64_t rid, std::error_code ec, const std::string& message,
                  bool fatal) override {
    error_frames.push_back({rid, ec, message, fatal});
  }
  uint64_t next_request_id() override {
    const uint64_t id = next_id_;
    next_id_ += 2;
    return id;
  }
  void arm_deadline(Clock::time_point at) override {
    if (at < armed) armed = at;
  }
  std::shared_ptr<TransportManager> pick_transport(const std::string& requested,
                                                   const std::string& ref_transport,
                                                   std::error_code& ec) const override {
    for (const auto& want : {requested, ref_transport}) {
      if (want.empty() || want == "auto") continue;
      for (const auto& t : transports) {
        if (t->name() == want) return t;
      }
      if (want == requested) {
        ec = errc::transport_unknown;
        return nullptr;
      }
    }
    if (transports.empty()) ec = errc::transport_unavailable;
    return transports.empty() ? nullptr : transports.front();
  }
  std::shared_ptr<TransportManager> fallback_transport(
      const TransportManager& failed) const override {
    for (const auto& t : transports) {
      if (t.get() != &failed) return t;
    }
    return nullptr;
  }
  void ensure_channel(const std::shared_ptr<TransportManager>& transport,
                      std::function<void(std::error_code)> done) override {
    if (channels.count(transport->name())) return done({});
    if (std::exchange(channel_open_throws, false)) throw std::bad_alloc();
    if (hold_channel_opens) return opening.push_back({transport->name(), std::move(done)});
    done(errc::transport_unavailable);
  }
  void fetch_completed() override { ++completed; }
  ObjectId wait_for_name(const std::string& name) override {
    auto it = names.find(name);
    if (it != names.end()) return it->second;
    ++name_waits;
    return 0;
  }
  void forget_name_wait(const std::string& name) override { forgotten.push_back(name); }

  // PeerLink
  PeerStrand& strand() override { return strand_; }
  // Owning when the fake is held by a shared_ptr, as a real session is (weak handles to it then
  // live as long as it does); a fake on the stack gives a handle that does not own it, whose
  // weak handles are expired at once.
  std::shared_ptr<PeerLink> shared_link() override {
    if (auto owned = weak_from_this().lock()) return owned;
    return std::shared_ptr<PeerLink>(std::shared_ptr<PeerLink>{}, this);
  }
  const PeerInfo& info() const override { return info_; }
  std::shared_ptr<TransportChannel> channel(std::string_view transport) const override {
    auto it = channels.find(std::string(transport));
    return it == channels.end() ? nullptr : it->second;
  }
  void complete_fetch(uint64_t, std::error_code) override {}
  void restart_fetch(uint64_t, std::error_code, uint64_t) override {}
  void fail(std::error_code) override {}
  bool install_channel(std::string_view, std::shared_ptr<TransportChannel>) override {
    return false;
  }
  void drop_channel(std::string_view, std::error_code) override {}
  void settle(uint64_t) override {}
  void send_transport_message(std::string_view, uint64_t, std::string) override {}
  void async_open_side_connection(std::string_view, SideConnectionHandler) override {}

  struct ErrorFrame {
    uint64_t rid;
    std::error_code ec;
    std::string message;
    bool fatal;
  };
  struct Opening {
    std::string transport;
    std::function<void(std::error_code)> done;
  };

  bool open = true;
  std::error_code reason;
  Clock::time_point clock = Clock::time_point{} + std::chrono::hours(1);
  Clock::time_point armed = Clock::time_point::max();
  std::vector<std::shared_ptr<FakeTransport>> transports;
  std::map<std::string, std::shared_ptr<TransportChannel>> channels;
  bool hold_channel_opens = false;   // ensure_channel of a missing channel waits in `opening`
  bool channel_open_throws = false;  // the next ensure_channel of a missing one throws bad_alloc
  std::vector<Opening> opening;
  std::deque<std::function<void()>> posted;
  std::vector<wire::Envelope> sent;
  std::vector<ErrorFrame> error_frames;
  std::map<std::string, ObjectId> names;
  int name_waits = 0;
  std::vector<std::string> forgotten;
  int completed = 0;
  boost::asio::io_context io_;

 private:
  PeerStrand strand_;
  PeerInfo info_;
  uint64_t next_id_;
};

}  // namespace ferry::fakes
