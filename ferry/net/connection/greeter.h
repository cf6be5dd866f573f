// The greeter: every incoming connection of the core, from accept to its first frame
// (internal); the mirror of the dialer (ferry/net/connection/dialer.h). A connection that starts
// with a TLS ClientHello gets the TLS handshake first; then exactly one frame is read, under a
// deadline and within a memory budget, and handed to the context, which accepts the connection (a
// Hello: a peer; an AttachChannel: a session's data channel) or rejects it with an Error frame.
//
// Before it has said who it is, a connection costs a bounded, small amount of memory whatever it
// announces: its first frame may be at most GreetOptions::max_frame_bytes, and the body is
// buffered as it arrives (GreetingBudget::kFirstRead bytes, then twice what has come), never at
// the announced size. What every greeting buffers beyond its first kFirstRead bytes is charged to
// one GreetingBudget; a connection whose next read would exceed it is closed. So N connections
// that have not said who they are hold at most N x kFirstRead + GreetingBudget::kBytes of buffers
// (docs/security.md).
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "ferry/net/connection/meta_stream.h"
#include "ferry/net/proto/ferry.pb.h"

namespace ferry {

// The bytes that every greeting of one context buffers beyond its first kFirstRead. Any thread.
class GreetingBudget {
 public:
  static constexpr size_t kFirstRead = 512;
  static constexpr uint64_t kBytes = 16u << 20;
  // Takes `bytes` more from the budget; false (nothing taken) when that would exceed kBytes.
  bool take(uint64_t bytes) {
    if (used_.fetch_add(bytes) + bytes <= kBytes) return true;
    used_.fetch_sub(bytes);
    return false;
  }
  void give_back(uint64_t bytes) { used_.fetch_sub(bytes); }

 private:
  std::atomic<uint64_t> used_{0};
};

struct GreetOptions {
  // A server TLS context for connections that start with a ClientHello. Null: such a connection
  // is closed (logged: this context has no certificate).
  boost::asio::ssl::context* tls = nullptr;
  // TLS and the first frame end by then, and so does a rejection's Error frame.
  std::chrono::milliseconds deadline{10000};
  // The largest first frame; a larger one is rejected with errc::frame_too_large.
  uint32_t max_frame_bytes = 0;
  std::shared_ptr<GreetingBudget> budget;
};

// One incoming connection with its first frame read. Handed to the context by async_greet; the
// context takes the connection (take) or rejects it (reject). If it does neither, the connection
// closes when the last reference goes or at the deadline. All calls on the greeting's strand
// (where the handler runs).
class Greeting : public std::enable_shared_from_this<Greeting> {
 public:
  Greeting(boost::asio::ip::tcp::socket socket, GreetOptions options, std::string peer);
  ~Greeting();
  Greeting(const Greeting&) = delete;
  Greeting& operator=(const Greeting&) = delete;

  const wire::Envelope& frame() const { return frame_; }
  // The connection's remote address, host:port, for logs.
  const std::string& peer() const { return peer_; }
  bool is_tls() const { return stream_.is_tls(); }
  // Takes the connection: the deadline ends, and the stream is the caller's (moved out).
  MetaStream take();
  // Logs `why`, writes an Error frame (fatal, `ec`, `why`) and closes the connection once it is
  // out, or at the deadline.
  void reject(std::error_code ec, const std::string& why);

 private:
  using OnFrame = std::function<void(std::shared_ptr<Greeting>)>;
  using Strand = boost::asio::strand<boost::asio::any_io_executor>;
  friend void async_greet(boost::asio::ip::tcp::socket socket, GreetOptions options,
                          OnFrame on_frame);
  void start(OnFrame on_frame);
  // The steps up to the parsed first frame; false when the connection was closed or rejected.
  boost::asio::awaitable<bool> read_first_frame();
  // Grows the body buffer to `bytes`, charging the budget; false (nothing grown) when the budget
  // cannot take it.
  bool reserve(size_t bytes);
  // Not a peer after all (or an error): close, and end the deadline.
  void finish();

  Strand strand_;
  MetaStream stream_;
  GreetOptions options_;
  std::string peer_;
  boost::asio::steady_timer timer_;
  std::array<unsigned char, 4> header_{};
  std::string body_;
  uint32_t expected_ = 0;  // the body length the header announced
  size_t got_ = 0;         // body bytes read so far
  uint64_t charged_ = 0;   // bytes of the budget this greeting holds
  wire::Envelope frame_;
};

// Greets the connection `socket` (just accepted): on its strand, TLS if it starts with a
// ClientHello, then its first frame; `on_frame` runs with the greeting once that frame has been
// read and parsed (a frame that is too large or malformed is rejected here and `on_frame` does not
// run; neither does it for a connection that ends, stays silent past the deadline or would exceed
// the budget: those are closed).
void async_greet(boost::asio::ip::tcp::socket socket, GreetOptions options,
                 std::function<void(std::shared_ptr<Greeting>)> on_frame);

}  // namespace ferry
