#include "cli/info.h"

#include <cstdio>
#include <string>
#include <vector>

#include "cli/json.h"
#include "cli/status.h"
#include "ferry.h"

namespace ferry::cli {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out.empty() ? "none" : out;
}

void print_text(const std::vector<RegisteredTransport>& registered,
                const std::vector<std::string>& instantiated,
                const std::vector<rdma::DeviceInfo>& devices) {
  std::printf("ferry %s\n", kVersion);
  std::printf("registered transports:\n");
  for (const auto& t : registered) {
    std::printf("  %-8s devices: %s\n", t.name.c_str(), join(t.devices).c_str());
  }
  if (registered.empty()) std::printf("  none\n");
  std::printf("default context transports (best first): %s\n", join(instantiated).c_str());
  std::printf("RDMA support: %s\n", rdma::compiled_in() ? "compiled in" : "not compiled in");
  std::printf("RDMA devices:%s\n", devices.empty() ? " none" : "");
  for (const auto& dev : devices) {
    std::printf("  %s\n", dev.name.c_str());
    for (const auto& port : dev.ports) {
      std::printf("    port %u: %s, %s\n", static_cast<unsigned>(port.port), port.state.c_str(),
                  port.link_layer.c_str());
      for (const auto& gid : port.gids) std::printf("      gid %s\n", gid.c_str());
    }
  }
}

void print_json(const std::vector<RegisteredTransport>& registered,
                const std::vector<std::string>& instantiated,
                const std::vector<rdma::DeviceInfo>& devices) {
  auto strings = [](JsonWriter& w, const std::vector<std::string>& items) {
    w.begin_array();
    for (const auto& item : items) w.value(item);
    w.end_array();
  };
  JsonWriter w;
  w.begin_object().key("version").value(kVersion).key("registered_transports").begin_array();
  for (const auto& t : registered) {
    w.begin_object().key("name").value(t.name).key("devices");
    strings(w, t.devices);
    w.end_object();
  }
  w.end_array().key("context_transports");
  strings(w, instantiated);
  w.key("rdma").begin_object().key("compiled_in").value(rdma::compiled_in());
  w.key("devices").begin_array();
  for (const auto& dev : devices) {
    w.begin_object().key("name").value(dev.name).key("ports").begin_array();
    for (const auto& port : dev.ports) {
      w.begin_object().key("port").value(uint64_t{port.port}).key("state").value(port.state);
      w.key("link_layer").value(port.link_layer).key("gids");
      strings(w, port.gids);
      w.end_object();
    }
    w.end_array().end_object();
  }
  w.end_array().end_object().end_object();
  std::fputs(w.str().c_str(), stdout);
}

}  // namespace

int run_info(bool json) {
  auto ctx = Context::create();
  if (!ctx) return fail(kExitUsage, "create a default context", ctx.error());
  const auto instantiated = (*ctx)->transports();
  (*ctx)->close();
  const auto registered = registered_transports();
  const auto devices = rdma::list_devices();
  if (json) {
    print_json(registered, instantiated, devices);
  } else {
    print_text(registered, instantiated, devices);
  }
  return kExitOk;
}

}  // namespace ferry::cli
