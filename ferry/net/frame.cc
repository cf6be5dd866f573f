#include "ferry/net/frame.h"

#include "ferry/net/errors.h"
#include "ferry/net/proto/ferry.pb.h"

namespace ferry {
namespace {
constexpr size_t kShrinkAbove = 256u << 10;
}  // namespace

std::string encode_frame(const wire::Envelope& env) {
  const size_t n = env.ByteSizeLong();
  std::string out(kFrameHeaderBytes + n, '\0');
  out[0] = static_cast<char>((n >> 24) & 0xff);
  out[1] = static_cast<char>((n >> 16) & 0xff);
  out[2] = static_cast<char>((n >> 8) & 0xff);
  out[3] = static_cast<char>(n & 0xff);
  env.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + kFrameHeaderBytes));
  return out;
}

FrameDecoder::FrameDecoder(uint32_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

std::error_code FrameDecoder::feed(std::string_view data, const FrameFn& on_frame) {
  if (failed_) return errc::protocol_error;
  buffer_.append(data);
  size_t pos = 0;
  std::error_code ec;
  while (buffer_.size() - pos >= kFrameHeaderBytes) {
    const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + pos);
    const uint32_t len = decode_frame_length(p);
    if (len > max_frame_bytes_) {
      ec = errc::frame_too_large;
      break;
    }
    if (buffer_.size() - pos - kFrameHeaderBytes < len) break;
    ec = on_frame(std::string_view(buffer_).substr(pos + kFrameHeaderBytes, len));
    pos += kFrameHeaderBytes + len;
    if (ec) break;
  }
  if (ec) {
    failed_ = true;
    buffer_.clear();
    return ec;
  }
  buffer_.erase(0, pos);
  // A large frame's buffer is not kept once it is decoded: a session holds what it is waiting
  // for, not the largest frame it ever had.
  if (buffer_.empty() && buffer_.capacity() > kShrinkAbove) std::string().swap(buffer_);
  return {};
}

std::error_code parse_envelope(std::string_view body, wire::Envelope& out) {
  if (!out.ParseFromArray(body.data(), static_cast<int>(body.size()))) return errc::protocol_error;
  return {};
}

}  // namespace ferry
