#include "ferry/net/registry.h"

#include <algorithm>
#include <mutex>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<detail::RegistryEntry> entries;
  std::vector<std::pair<uint64_t, std::function<void()>>> listeners;
  uint64_t next_listener = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::error_code register_transport(std::string name, std::vector<std::string> devices,
                                   TransportFactory factory) {
  return detail::register_transport(std::move(name), std::move(devices), std::move(factory), {});
}

std::error_code detail::register_transport(std::string name, std::vector<std::string> devices,
                                           TransportFactory factory,
                                           std::function<std::any()> from_environment) {
  if (name.empty() || !factory) return errc::invalid_argument;
  auto& r = registry();
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard lock(r.mu);
    for (const auto& e : r.entries) {
      if (e.name == name) return errc::transport_duplicate;
    }
    r.entries.push_back(
        {std::move(name), std::move(devices), std::move(factory), std::move(from_environment)});
    for (const auto& [id, l] : r.listeners) listeners.push_back(l);
  }
  for (const auto& l : listeners) l();  // contexts pick the new transport up
  return {};
}

std::error_code unregister_transport(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = std::find_if(r.entries.begin(), r.entries.end(),
                         [&](const auto& e) { return e.name == name; });
  if (it == r.entries.end()) return errc::transport_unknown;
  r.entries.erase(it);
  return {};
}

std::vector<RegisteredTransport> registered_transports() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<RegisteredTransport> out;
  for (const auto& e : r.entries) out.push_back({e.name, e.devices});
  return out;
}

namespace detail {
std::error_code wrong_options_type(std::string_view name) {
  FERRY_LOG_WARN(
      "transport {}: its entry of ContextOptions::transport_options is not of the "
      "options type it registered with",
      name);
  return errc::invalid_argument;
}

std::vector<RegistryEntry> registry_snapshot() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return r.entries;
}
uint64_t add_registry_listener(std::function<void()> listener) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.listeners.emplace_back(r.next_listener, std::move(listener));
  return r.next_listener++;
}

void remove_registry_listener(uint64_t id) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::erase_if(r.listeners, [id](const auto& l) { return l.first == id; });
}

}  // namespace detail

}  // namespace ferry
