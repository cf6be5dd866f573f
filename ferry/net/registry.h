/// @file
/// The runtime transport registry: TCP, RDMA and a user's transport all register here.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ferry/mem/pool.h"
#include "ferry/net/result.h"
#include "ferry/net/transport.h"

namespace ferry {

class ObjectStore;

/// What a factory gets to build a transport instance for one Context.
struct TransportEnv {
  boost::asio::io_context& io;    ///< the context's io_context: the transport's I/O runs on it
  ObjectStore& store;             ///< the context's store (owner side: the objects it serves)
  const ContextOptions& options;  ///< the context's options (chunk sizes, grants, timeouts)
  /// The context's receive pool: a transport that registers memory registers its regions as they
  /// appear (mem::Pool::add_region_listener), so fetches into pool memory register nothing.
  std::shared_ptr<mem::Pool> pool;
};

/// Builds a transport's instance for one Context, on the thread that creates the Context (or that
/// registers the transport, for Contexts that exist then). An error means the transport is not
/// usable here (no device, say): the Context goes on without it (logged), unless
/// ContextOptions::transports names it, which makes the constructor throw. The env's references
/// live as long as the Context; the instance may outlive it.
using TransportFactory =
    std::function<Result<std::shared_ptr<TransportManager>>(const TransportEnv& env)>;

/// A registration as registered_transports() reports it.
struct RegisteredTransport {
  std::string name;  ///< the name it is registered under ("TCP", "RDMA", ...)
  /// the devices it was registered with (listed by `ferry info`)
  std::vector<std::string> devices;
};

/// Registers a transport process-wide. Contexts created afterwards instantiate it (each with its
/// own instance from `factory`). Errors: invalid_argument (empty name or null factory),
/// transport_duplicate (name taken). Thread-safe.
std::error_code register_transport(std::string name, std::vector<std::string> devices,
                                   TransportFactory factory);
/// Removes a registration; transport_unknown if there is none. Existing Contexts keep theirs.
std::error_code unregister_transport(std::string_view name);
/// Every registration now, in registration order. Thread-safe.
std::vector<RegisteredTransport> registered_transports();

namespace detail {
struct RegistryEntry {
  std::string name;
  std::vector<std::string> devices;
  TransportFactory factory;
};
std::vector<RegistryEntry> registry_snapshot();
// Called (on the registering thread, no registry lock held) after each new registration.
uint64_t add_registry_listener(std::function<void()> listener);
void remove_registry_listener(uint64_t id);
}  // namespace detail

}  // namespace ferry
