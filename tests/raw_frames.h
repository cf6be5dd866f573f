// Frames over a raw blocking socket, for tests that play a peer (or an attacker) by hand.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <optional>
#include <string>

#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"

namespace ferry::testing_frames {

// The next frame on `s`, or nullopt on EOF, an error or a body that does not parse. Blocks.
inline std::optional<wire::Envelope> read_frame(boost::asio::ip::tcp::socket& s) {
  unsigned char h[4];
  boost::system::error_code ec;
  boost::asio::read(s, boost::asio::buffer(h), ec);
  if (ec) return std::nullopt;
  std::string body(decode_frame_length(h), '\0');
  boost::asio::read(s, boost::asio::buffer(body), ec);
  wire::Envelope env;
  if (ec || !env.ParseFromString(body)) return std::nullopt;
  return env;
}

// Writes `env` as one frame; errors are ignored (the peer's answer, or none, says what happened).
inline void write_frame(boost::asio::ip::tcp::socket& s, const wire::Envelope& env) {
  boost::system::error_code ignored;
  boost::asio::write(s, boost::asio::buffer(encode_frame(env)), ignored);
}

}  // namespace ferry::testing_frames
