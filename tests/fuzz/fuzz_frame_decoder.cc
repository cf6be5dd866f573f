// Fuzz target: the metadata channel's frame decoder and envelope parser, fed in pieces whose
// sizes come from the input itself. Must never crash, leak or read out of bounds, and never
// hand out a frame larger than the maximum.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/net/errors.h"
#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  constexpr uint32_t kMax = 64 * 1024;
  ferry::FrameDecoder decoder(kMax);
  const size_t piece = 1 + data[0] % 97;  // first byte: how the stream is split
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  while (!rest.empty()) {
    auto ec = decoder.feed(rest.substr(0, piece), [](std::string_view body) {
      if (body.size() > kMax) __builtin_trap();
      ferry::wire::Envelope env;
      return ferry::parse_envelope(body, env);
    });
    if (ec) break;
    rest.remove_prefix(std::min(piece, rest.size()));
  }
  return 0;
}
