/// @file
/// Framing of the metadata channel: a 4-byte big-endian length, then one protobuf Envelope.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

namespace ferry::wire {
class Envelope;
}

namespace ferry {

/// Bytes of a frame's length header.
inline constexpr uint32_t kFrameHeaderBytes = 4;
/// The largest frame body a FrameDecoder accepts unless told otherwise
/// (ContextOptions::max_frame_bytes has the same default).
inline constexpr uint32_t kDefaultMaxFrameBytes = 4u << 20;
/// The largest frame either side accepts before the handshake has ended (Hello, HelloAnswer, Auth,
/// a transport's channel setup, AttachChannel): real ones are a few hundred bytes, and a peer
/// that has not proved who it is may not make the other side buffer more.
inline constexpr uint32_t kMaxHandshakeFrameBytes = 16u << 10;

/// The body length a frame header announces (big-endian).
inline uint32_t decode_frame_length(const unsigned char* header) {
  return (uint32_t{header[0]} << 24) | (uint32_t{header[1]} << 16) | (uint32_t{header[2]} << 8) |
         uint32_t{header[3]};
}

/// Serializes `env` into a frame (header + body).
std::string encode_frame(const wire::Envelope& env);

/// Incremental decoder: feed it whatever the socket produced, it hands out whole frames.
/// A length above the maximum is an error at once (before any body byte is buffered), so a
/// peer cannot make us allocate what it claims.
class FrameDecoder {
 public:
  /// Called once per complete frame body; returning an error stops decoding.
  using FrameFn = std::function<std::error_code(std::string_view body)>;

  /// A decoder that refuses frames whose body exceeds `max_frame_bytes` (frame_too_large). One per
  /// byte stream; no locking: the stream's reader uses it.
  explicit FrameDecoder(uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

  /// Consumes all of `data`. Returns the first error (frame_too_large, or whatever on_frame
  /// returned); the decoder is unusable after an error.
  std::error_code feed(std::string_view data, const FrameFn& on_frame);

  /// Bytes buffered of a frame not yet complete.
  size_t pending_bytes() const { return buffer_.size(); }
  /// Changes the maximum for frames not yet decoded (a session raises it once the peer is
  /// authenticated).
  void set_max_frame_bytes(uint32_t max_frame_bytes) { max_frame_bytes_ = max_frame_bytes; }

 private:
  uint32_t max_frame_bytes_;
  std::string buffer_;
  bool failed_ = false;
};

/// Parses a frame body; protocol_error when it is not a valid Envelope.
std::error_code parse_envelope(std::string_view body, wire::Envelope& out);

}  // namespace ferry
