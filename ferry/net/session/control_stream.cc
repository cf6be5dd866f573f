#include "ferry/net/session/control_stream.h"

#include <algorithm>
#include <boost/asio/post.hpp>

#include "ferry/net/core/guard.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"

namespace ferry {
namespace asio = boost::asio;

ControlStream::ControlStream(Owner& owner, PeerStrand& strand, asio::io_context& io,
                             MetaStream stream, Options options)
    : owner_(owner),
      strand_(strand),
      stream_(std::move(stream)),
      options_(options),
      decoder_(options.handshake_frame_bytes),
      close_timer_(io),
      heartbeat_timer_(io) {}

ControlStream::~ControlStream() { give_back_charge(); }

void ControlStream::start() {
  last_rx_ = Clock::now();
  read_more();
}

void ControlStream::open() {
  phase_ = Phase::open;
  give_back_charge();
  decoder_.set_max_frame_bytes(options_.max_frame_bytes);
  arm_heartbeat();
}

void ControlStream::drain() {
  if (phase_ != Phase::closed) phase_ = Phase::draining;
}

void ControlStream::close() {
  if (phase_ == Phase::closed) return;
  phase_ = Phase::closed;
  close_timer_.cancel();
  heartbeat_timer_.cancel();
  stream_.close();
  give_back_charge();
}

bool ControlStream::charge_pending() {
  if (!options_.budget || phase_ != Phase::handshaking) return true;
  const size_t pending = decoder_.pending_bytes();
  const size_t want =
      pending > GreetingBudget::kFirstRead ? pending - GreetingBudget::kFirstRead : 0;
  if (want > charged_) {
    if (!options_.budget->take(want - charged_)) return false;
  } else {
    options_.budget->give_back(charged_ - want);
  }
  charged_ = want;
  return true;
}

void ControlStream::give_back_charge() {
  if (options_.budget && charged_ > 0) options_.budget->give_back(charged_);
  charged_ = 0;
}

void ControlStream::out_of_memory() {
  const PeerInfo& peer = owner_.peer_info();
  FERRY_LOG_ERROR("peer '{}' ({}): out of memory handling its connection; closing it", peer.name,
                  peer.address);
  owner_.on_end(errc::resource_exhausted, false);
}

// ---------------------------------------------------------------- reading

void ControlStream::read_more() {
  // Before open() a little at a time (a handshake frame is a few hundred bytes): an unproven
  // peer touches no more of the buffer than that, and what the decoder keeps beyond it is
  // charged to the budget (charge_pending).
  const size_t room = phase_ == Phase::handshaking ? GreetingBudget::kFirstRead : read_buf_.size();
  stream_.async_read_some(
      asio::buffer(read_buf_.data(), room),
      guarded(*this, [this](boost::system::error_code ec, size_t n) { on_read(ec, n); }));
}

void ControlStream::on_read(const boost::system::error_code& ec, size_t n) {
  if (ec) {
    const bool eof = ec == asio::error::eof;
    owner_.on_end(eof ? std::error_code(errc::peer_closed) : std::error_code(ec), eof);
    return;
  }
  last_rx_ = Clock::now();
  auto err = decoder_.feed(std::string_view(read_buf_.data(), n),
                           [this](std::string_view body) { return on_frame(body); });
  if (err && phase_ == Phase::handshaking) {
    owner_.on_end(errc::handshake_failed, false);  // whatever answered is not a ferry peer
    return;
  }
  if (!err && !charge_pending()) {
    const PeerInfo& peer = owner_.peer_info();
    FERRY_LOG_WARN("peer '{}' ({}): connections not yet authenticated hold {} bytes; closing it",
                   peer.name, peer.address, GreetingBudget::kBytes);
    owner_.on_end(errc::resource_exhausted, false);
    return;
  }
  if (err) {
    const PeerInfo& peer = owner_.peer_info();
    FERRY_LOG_WARN("peer '{}' ({}): {}; closing its connection", peer.name, peer.address,
                   err.message());
    send_error(0, err,
               err == errc::frame_too_large
                   ? "frame length exceeds the maximum of " +
                         std::to_string(options_.max_frame_bytes) + " bytes"
                   : "malformed frame",
               true);
    return;  // stop reading: the connection ends once the error frame is out
  }
  if (phase_ != Phase::closed && !close_after_write_) read_more();
}

std::error_code ControlStream::on_frame(std::string_view body) {
  if (close_after_write_ || phase_ == Phase::closed) return {};
  wire::Envelope env;
  if (auto ec = parse_envelope(body, env)) return ec;
  return owner_.on_envelope(env);
}

// ---------------------------------------------------------------- writing

void ControlStream::send(const wire::Envelope& env) {
  if (phase_ == Phase::closed || phase_ == Phase::draining || close_after_write_) return;
  auto frame = encode_frame(env);
  const size_t bytes = frame.size();
  write_queue_.push_back(std::move(frame));
  queued_bytes_ += bytes;  // after the push, which may throw
  if (queued_bytes_ > options_.max_queued_bytes) {
    // The peer does not read what we send it: it cannot be served, and must not cost memory.
    const PeerInfo& peer = owner_.peer_info();
    FERRY_LOG_WARN("peer '{}' ({}) is not reading its control channel; closing it", peer.name,
                   peer.address);
    end_soon(errc::peer_unresponsive);
    return;
  }
  // An idle connection writes at once; frames queued while a write is in flight go out together
  // after it, in one system call and one read at the peer (a collective's fetches of one call,
  // posted back to back, cost two request writes per peer instead of one per fetch).
  write_more();
}

void ControlStream::send_error(uint64_t rid, std::error_code ec, const std::string& message,
                               bool fatal) {
  send(error_envelope(rid, ec, message, fatal));
  if (!fatal) return;
  write_more();  // now: the connection ends once this frame is out
  close_after_write_ = true;
  close_after_write_ec_ = ec;
  // Bounded: a peer that never reads the error does not keep the connection.
  close_timer_.expires_after(std::chrono::seconds(1));
  close_timer_.async_wait(
      on_expiry(*this, [this] { owner_.on_end(close_after_write_ec_, false); }));
  if (writing_.empty()) end_soon(ec);  // nothing to wait for: the frame was dropped
}

void ControlStream::end_soon(std::error_code ec) {
  // Nothing more is read or sent; the owner hears of the end from the loop, not from inside the
  // send that its caller made while walking its own tables (which on_end clears).
  close_after_write_ = true;
  close_after_write_ec_ = ec;
  boost::asio::post(guarded(*this, [this, ec] { owner_.on_end(ec, false); }));
}

void ControlStream::write_more() {
  if (!writing_.empty() || write_queue_.empty() || phase_ == Phase::closed) return;
  std::vector<asio::const_buffer> buffers;
  while (!write_queue_.empty() && writing_.size() < 64) {
    writing_.push_back(std::move(write_queue_.front()));
    write_queue_.pop_front();
  }
  for (const auto& f : writing_) buffers.emplace_back(asio::buffer(f));
  stream_.async_write(buffers, guarded(*this, [this](boost::system::error_code ec, size_t n) {
                        queued_bytes_ -= n;
                        writing_.clear();
                        if (ec) {
                          // Draining: the peer is gone already; its data channel decides.
                          if (phase_ != Phase::draining) owner_.on_end(errc::peer_closed, false);
                          return;
                        }
                        if (close_after_write_ && write_queue_.empty()) {
                          owner_.on_end(close_after_write_ec_, false);
                          return;
                        }
                        write_more();
                      }));
}

// ---------------------------------------------------------------- liveness

void ControlStream::arm_heartbeat() {
  heartbeat_timer_.expires_after(options_.heartbeat_interval);
  heartbeat_timer_.async_wait(on_expiry(*this, [this] {
    if (phase_ != Phase::open) return;
    if (Clock::now() - last_rx_ > options_.peer_timeout) {
      const PeerInfo& peer = owner_.peer_info();
      FERRY_LOG_WARN("peer '{}' ({}) silent for {} ms; closing", peer.name, peer.address,
                     options_.peer_timeout.count());
      owner_.on_end(errc::peer_unresponsive, false);
      return;
    }
    wire::Envelope ping;
    ping.mutable_ping()->set_nonce(0);
    send(ping);
    arm_heartbeat();
  }));
}

}  // namespace ferry
