// The dialer: every outgoing connection of the core, from the address to the first answer
// (internal). The metadata connection to a peer (Context::connect) and a session's side
// connections for a transport's data channel (PeerLink::async_open_side_connection) both go
// through async_dial; the accept side's mirror is ferry/net/connection/greeter.h.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "ferry/net/address.h"
#include "ferry/net/connection/meta_stream.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/result.h"

namespace ferry {

struct DialOptions {
  // The whole dial (resolve, connect, TLS, the first frame and its answer) ends by then, with
  // errc::timed_out.
  std::chrono::milliseconds deadline{10000};
  // A client TLS context: the stream is TLS, and the server's certificate must name the host
  // dialled (SNI is sent for a host name). Null: plain TCP.
  boost::asio::ssl::context* tls = nullptr;
  // A frame (encode_frame) written once connected. Empty: none is written and no answer read.
  std::string first_frame;
  // The largest answer to first_frame accepted.
  uint32_t max_answer_bytes = 4096;
};

struct Dialed {
  MetaStream stream;
  wire::Envelope answer;  // the answer to DialOptions::first_frame; empty when none was sent
};

using DialHandler = std::function<void(Result<Dialed>)>;

// Connects to `target` (an IP address is used as it is, a name is resolved), with
// TCP_NODELAY and close-on-exec, runs the TLS handshake when options.tls is set, writes
// options.first_frame and reads one answer frame, all under options.deadline. The connection's
// socket belongs to `io`; the dial's steps run on a strand of `io` of their own; `done` runs
// exactly once, on `executor` (a session's strand, or the io_context's), also when an
// allocation fails. Errors: errc::host_unresolved,
// connection_refused, connection_failed, timed_out (the deadline), tls_failed, handshake_failed
// (the connection ended before its answer), protocol_error (an answer that is not a frame or
// larger than max_answer_bytes), aborted (the returned canceller ran first), or the code of an
// Error frame the peer answered with. Returns a canceller: any thread, any number of times; it
// ends the step in progress, and the dial with errc::aborted, unless it has ended already.
std::function<void()> async_dial(boost::asio::io_context& io, boost::asio::any_io_executor executor,
                                 HostPort target, DialOptions options, DialHandler done);

}  // namespace ferry
