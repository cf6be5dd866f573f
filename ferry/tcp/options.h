/// @file
/// TcpOptions: the TCP transport's own settings. A Context carries them to the transport in
/// ContextOptions::transport_options under "TCP" (tcp::kTransportName).
#pragma once

#include <cstddef>
#include <string>

namespace ferry::tcp {

/// What the TCP transport of one Context is configured with. Set it with
/// `options.transport_options_for<tcp::TcpOptions>(tcp::kTransportName)`; a context with no entry
/// uses these defaults.
struct TcpOptions {
  size_t chunk_bytes = 1u << 20;  ///< data channel: bytes per chunk (0: 1 MiB)
  /// The data channels' congestion control. "": automatic: a data channel between two endpoints
  /// of this host uses reno (BBR's pacing only delays the bytes there, and cubic's HyStart leaves
  /// slow start early on a busy host: ferry/tcp/congestion.h); every other one keeps the system's
  /// default. "system": always the system's default. Any other text: that algorithm (e.g.
  /// "cubic", "reno") for every data channel; one the kernel refuses is logged and the default
  /// stays. Metadata channels always keep the system's default.
  std::string congestion;

  /// The defaults with what the environment sets: `congestion` from $FERRY_TCP_CONGESTION.
  /// ContextOptions::from_environment() calls it (the transport registers it).
  static TcpOptions from_environment();
};

}  // namespace ferry::tcp
