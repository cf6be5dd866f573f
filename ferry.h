// ferry: asynchronous tensor and buffer transfers between processes.
// Include this (and link ferry::ferry) to get the whole library with its built-in transports
// registered before main() runs.
#pragma once

#include "collective/group.h"
#include "collective/reduce.h"
#include "collective/service.h"
#include "net/context.h"
#include "net/errors.h"
#include "net/fetch.h"
#include "net/object_ref.h"
#include "net/peer.h"
#include "net/registry.h"
#include "net/stats.h"
#include "net/transport.h"
#include "rdma/devices.h"
#include "rdma/rdma.h"
#include "store/object_store.h"
#include "store/tensor.h"
#include "tcp/tcp_transport.h"

namespace ferry {

// Registers the transports built into this ferry (TCP; RDMA when built with rdma-core) through
// the public registry, exactly as a user's transport would register. Idempotent.
inline bool register_builtin_transports() {
  rdma::register_rdma_transport();
  return tcp::register_tcp_transport();
}

namespace detail {
// Every program that includes ferry.h registers the built-ins during static initialization.
inline const bool kBuiltinTransportsRegistered = register_builtin_transports();
}  // namespace detail

inline constexpr const char* kVersion = "0.1.0";

}  // namespace ferry
