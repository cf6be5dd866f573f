/// @file
/// The runtime transport registry: TCP, RDMA and a user's transport all register here.
#pragma once

#include <any>
#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ferry/mem/pool.h"
#include "ferry/net/errors.h"
#include "ferry/net/loop_gate.h"
#include "ferry/net/result.h"
#include "ferry/net/transport.h"

namespace ferry {

class ObjectStore;

/// What a factory gets to build a transport instance for one Context.
struct TransportEnv {
  boost::asio::io_context& io;    ///< the context's io_context: the transport's I/O runs on it
  ObjectStore& store;             ///< the context's store (owner side: the objects it serves)
  const ContextOptions& options;  ///< the context's options (the core's: timeouts, limits)
  /// This transport's entry of ContextOptions::transport_options, empty when the context has none.
  /// A transport registered with an options type gets it typed, as its factory's second argument.
  const std::any& transport_options;
  /// The context's receive pool: a transport that registers memory registers its regions as they
  /// appear (mem::Pool::add_region_listener), so fetches into pool memory register nothing.
  std::shared_ptr<mem::Pool> pool;
  /// How a thread of the transport's own (a worker, a reaper) posts to `io`: through this gate,
  /// never straight, since the loop may have run for the last time by then (LoopGate). The
  /// transport and its workers may keep it as long as they like.
  std::shared_ptr<LoopGate> loop_gate;
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

/// Registers a transport process-wide, one without options of its own (the overload below
/// registers one with). Contexts created afterwards instantiate it (each with its own instance
/// from `factory`). Errors: invalid_argument (empty name or null factory), transport_duplicate
/// (name taken). Thread-safe.
std::error_code register_transport(std::string name, std::vector<std::string> devices,
                                   TransportFactory factory);
/// A factory for a transport with options of its own type (the register_transport below): it
/// gets the context's options for it as well.
template <typename Options>
using TransportFactoryWith = std::function<Result<std::shared_ptr<TransportManager>>(
    const TransportEnv& env, const Options& options)>;

namespace detail {
// register_transport with the hook ContextOptions::from_environment() calls for the transport's
// entry (none when null).
std::error_code register_transport(std::string name, std::vector<std::string> devices,
                                   TransportFactory factory,
                                   std::function<std::any()> from_environment);
// Logs that the context's options for transport `name` are not of its type; invalid_argument.
std::error_code wrong_options_type(std::string_view name);
}  // namespace detail

/// Registers a transport that declares options of its own, of type `Options` (copyable and
/// default-constructible), as the built-ins do (tcp::TcpOptions, rdma::RdmaOptions). An
/// application sets them in ContextOptions::transport_options under `name`
/// (ContextOptions::transport_options_for<Options>(name)); `factory` gets the context's entry, or
/// Options{} when it has none. An entry of another type fails the factory with invalid_argument
/// (logged), as a transport that is not usable. `from_environment`, when given, is how the
/// transport reads its environment variables: ContextOptions::from_environment() fills the entry
/// with it. Errors as the overload above. Thread-safe.
template <typename Options>
std::error_code register_transport(std::string name, std::vector<std::string> devices,
                                   TransportFactoryWith<Options> factory,
                                   std::function<Options()> from_environment = {}) {
  if (!factory) return errc::invalid_argument;
  std::function<std::any()> environment;
  if (from_environment) {
    environment = [read = std::move(from_environment)] { return std::any(read()); };
  }
  auto typed = [name, factory = std::move(factory)](
                   const TransportEnv& env) -> Result<std::shared_ptr<TransportManager>> {
    if (!env.transport_options.has_value()) return factory(env, Options{});
    if (const auto* own = std::any_cast<Options>(&env.transport_options)) return factory(env, *own);
    return detail::wrong_options_type(name);
  };
  return detail::register_transport(std::move(name), std::move(devices), std::move(typed),
                                    std::move(environment));
}

/// Removes a registration; transport_unknown if there is none. Existing Contexts keep theirs.
std::error_code unregister_transport(std::string_view name);
/// Every registration now, in registration order. Thread-safe.
std::vector<RegisteredTransport> registered_transports();

namespace detail {
struct RegistryEntry {
  std::string name;
  std::vector<std::string> devices;
  TransportFactory factory;
  std::function<std::any()> from_environment;  // the transport's options from $..., or null
};
std::vector<RegistryEntry> registry_snapshot();
// Called (on the registering thread, no registry lock held) after each new registration.
uint64_t add_registry_listener(std::function<void()> listener);
void remove_registry_listener(uint64_t id);
}  // namespace detail

}  // namespace ferry
