/// @file
/// ferry: asynchronous tensor and buffer transfers between processes.
/// Include this (and link ferry::ferry) to get the whole library with its built-in transports
/// registered before main() runs.
#pragma once

#include "ferry/cma/cma_transport.h"
#include "ferry/cma/options.h"
#include "ferry/collective/group.h"
#include "ferry/collective/reduce.h"
#include "ferry/collective/service.h"
#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/fetch.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/peer.h"
#include "ferry/net/registry.h"
#include "ferry/net/stats.h"
#include "ferry/net/transport.h"
#include "ferry/rdma/devices.h"
#include "ferry/rdma/options.h"
#include "ferry/rdma/rdma.h"
#include "ferry/store/object_store.h"
#include "ferry/store/tensor.h"
#include "ferry/tcp/options.h"
#include "ferry/tcp/tcp_transport.h"

/// ferry's library: Context, Peer, ObjectRef and fetches, the store, errors, the transport
/// interface and registry (the main page says where to start).
namespace ferry {

/// Registers the transports built into this ferry (TCP, CMA; RDMA when built with rdma-core)
/// through the public registry, exactly as a user's transport would register. Idempotent.
inline bool register_builtin_transports() {
  // FERRY_NO_RDMA_TRANSPORT: set for a consumer that found ferry with COMPONENTS tcp only
  // (ferryConfig.cmake), which does not link the RDMA library.
#ifndef FERRY_NO_RDMA_TRANSPORT
  rdma::register_rdma_transport();
#endif
  cma::register_cma_transport();
  return tcp::register_tcp_transport();
}

namespace detail {
// Every program that includes ferry.h registers the built-ins during static initialization.
inline const bool kBuiltinTransportsRegistered = register_builtin_transports();
}  // namespace detail

/// This ferry's version, as `ferry info` prints it (the CMake project's version).
inline constexpr const char* kVersion = "0.1.0";

}  // namespace ferry
