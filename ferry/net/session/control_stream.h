// ControlStream: one peer's metadata connection as frames (internal). It reads and decodes
// frames and hands each Envelope up, queues the frames this side sends and writes those queued
// together in one write, pings the peer and watches its silence, and writes a fatal Error before
// it ends the connection.
//
// Thread model: every method runs on the peer strand, and so does every call to its Owner. It
// depends only on its Owner, never on Session.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/net/connection/greeter.h"
#include "ferry/net/connection/meta_stream.h"
#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/transport.h"

namespace ferry {

class ControlStream {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    uint32_t handshake_frame_bytes = kMaxHandshakeFrameBytes;  // the largest frame before open()
    uint32_t max_frame_bytes = kDefaultMaxFrameBytes;          // the largest one after
    size_t max_queued_bytes = 64u << 20;  // queued and unwritten: more ends the connection
    std::chrono::milliseconds heartbeat_interval{1000};  // a Ping this often once open
    std::chrono::milliseconds peer_timeout{10000};       // silence that ends the connection
    // Until open() (the peer has proved itself), what the stream buffers beyond
    // GreetingBudget::kFirstRead is taken from this budget, shared with the connections still
    // greeting: one that would exceed it ends (resource_exhausted). Null: not bounded.
    std::shared_ptr<GreetingBudget> budget;
  };

  // What the stream needs of the session it belongs to. Every call is on the strand.
  class Owner {
   public:
    virtual ~Owner() = default;
    // Keeps the owner, and the stream it owns, alive while the handle is held: every pending
    // read, write, post and timer wait of the stream holds one.
    virtual std::shared_ptr<void> keep_alive() = 0;
    // The peer, for log lines.
    virtual const PeerInfo& peer_info() const = 0;
    // A whole Envelope from the peer. An error it returns ends the connection as a malformed
    // frame does.
    virtual std::error_code on_envelope(const wire::Envelope& env) = 0;
    // The connection ended, or must end, with `ec`: peer_closed (the peer closed it, or a write
    // failed), the read error, peer_unresponsive (silence past peer_timeout, or a queue past
    // max_queued_bytes), handshake_failed (a malformed frame before open()), or the error a
    // fatal send_error() carried. `peer_eof`: the peer closed its side in an orderly way. The
    // stream reads no more; the owner answers with close() or, on `peer_eof`, drain(). Never
    // called from inside send() or send_error(): their caller may be walking state that the
    // owner's close clears.
    virtual void on_end(std::error_code ec, bool peer_eof) = 0;
  };

  // Takes `stream`, connected; `owner` and `strand` outlive the stream.
  ControlStream(Owner& owner, PeerStrand& strand, boost::asio::io_context& io, MetaStream stream,
                Options options);
  ~ControlStream();
  ControlStream(const ControlStream&) = delete;
  ControlStream& operator=(const ControlStream&) = delete;

  // The connection's socket, for its addresses. Valid while the stream lives.
  MetaStream::tcp::socket& socket() { return stream_.socket(); }

  // Starts reading: each frame goes to Owner::on_envelope, in order, until the connection ends.
  // The peer counts as heard from now. Once.
  void start();
  // The handshake is done: frames up to max_frame_bytes are accepted, and the heartbeat starts.
  void open();
  // The peer has closed its side and the owner waits for its data channel: nothing more is sent
  // and a failed write no longer ends anything.
  void drain();
  // Ends the connection: the socket closes, pending operations end without calling the owner,
  // and nothing more is read, sent or reported. Idempotent.
  void close();

  // Queues a frame for the peer. On an idle connection the write starts at once (a lone request
  // costs no trip through the loop; its completion still never runs inline); frames queued while
  // a write is in flight leave together after it, in one write. Dropped while draining, once
  // closed, or once a fatal error is on its way. A frame that takes the queue past
  // max_queued_bytes ends the connection: nothing more is sent, and Owner::on_end follows from
  // the loop.
  void send(const wire::Envelope& env);
  // Sends an Error frame for request `rid` (a ferry error's own code, peer_closed for others).
  // With `fatal`, nothing after it is read or sent, and the connection ends (Owner::on_end with
  // `ec`) once it is written, or after a second if the peer does not read it.
  void send_error(uint64_t rid, std::error_code ec, const std::string& message, bool fatal);

  // The callback guard's view (ferry/net/core/guard.h): the owner's strand and keep-alive, and
  // whether close() ran. out_of_memory (handling what the peer sent, say: a frame half handled
  // cannot be taken back) ends the connection with resource_exhausted through Owner::on_end.
  PeerStrand& strand() { return strand_; }
  std::shared_ptr<void> keep_alive() { return owner_.keep_alive(); }
  bool closed() const { return phase_ == Phase::closed; }
  void out_of_memory();

 private:
  enum class Phase { handshaking, open, draining, closed };

  void read_more();
  void on_read(const boost::system::error_code& ec, size_t n);
  std::error_code on_frame(std::string_view body);
  void write_more();
  void arm_heartbeat();
  // Stops reading and sending, and posts Owner::on_end(ec).
  void end_soon(std::error_code ec);
  // Before open(): takes from (or gives back to) options_.budget what the decoder holds beyond
  // kFirstRead; false when the budget has no room for it.
  bool charge_pending();
  void give_back_charge();

  Owner& owner_;
  PeerStrand& strand_;
  MetaStream stream_;
  const Options options_;
  Phase phase_ = Phase::handshaking;

  FrameDecoder decoder_;
  std::array<char, 64 * 1024> read_buf_;
  Clock::time_point last_rx_;
  std::deque<std::string> write_queue_;
  std::vector<std::string> writing_;
  size_t queued_bytes_ = 0;
  size_t charged_ = 0;  // taken from options_.budget
  bool close_after_write_ = false;
  std::error_code close_after_write_ec_;
  boost::asio::steady_timer close_timer_;  // bounds the wait for a fatal error's write
  boost::asio::steady_timer heartbeat_timer_;
};

}  // namespace ferry
