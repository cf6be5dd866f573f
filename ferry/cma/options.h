/// @file
/// CmaOptions: the CMA transport's own settings. A Context carries them to the transport in
/// ContextOptions::transport_options under "CMA" (cma::kTransportName).
#pragma once

#include <cstddef>

namespace ferry::cma {

/// What the CMA transport of one Context is configured with. Set it with
/// `options.transport_options_for<cma::CmaOptions>(cma::kTransportName)`; a context with no entry
/// uses these defaults.
struct CmaOptions {
  /// Whether "auto" transport selection picks CMA for a peer on this host (above TCP, below
  /// RDMA). Off: CMA moves bytes only when a fetch or a connection asks for it by name
  /// (FetchOptions::transport, ContextOptions::transport = "CMA").
  bool preferred = false;
  /// Bytes a fetch copies per turn of the peer's strand: an abort gets a say between steps, and
  /// the peer's other work waits at most one step (0: 8 MiB).
  size_t copy_step = 8u << 20;
  /// Threads that copy one step together: the strand's thread and copy_threads - 1 helpers of
  /// the transport (0: the cores the process may run on, at most 8), each a share of at least 1 MiB
  /// (a step under 2 MiB is copied by one thread). One thread copies about 4-5 GB/s.
  unsigned copy_threads = 0;
  /// Objects up to this many bytes travel inside the grant on the metadata channel (the owner
  /// lets them go as it sends; no release follows), larger ones are read from the owner's
  /// memory. Copying through the metadata channel costs more per byte: on the 2-core VM, 16
  /// fetches in flight, it beat the read at 16 KiB (2.1 against 1.4 GB/s), matched it at 32 KiB
  /// and lost at 64 KiB (1.8 against 4.0).
  size_t inline_bytes = 16u << 10;

  /// The defaults with what the environment sets: `preferred` from $FERRY_CMA_PREFERRED ("1",
  /// "true" or "yes"; "0", "false" or "no"; anything else is logged and ignored).
  /// ContextOptions::from_environment() calls it (the transport registers it).
  static CmaOptions from_environment();
};

}  // namespace ferry::cma
