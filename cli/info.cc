#include "cli/info.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <openssl/opensslv.h>

#include "cli/pretty_json.h"
#include "cli/status.h"
#include "ferry/ferry.h"
#include "ferry/net/log.h"

namespace ferry::cli {
namespace {

// One setting a default context takes from the environment: its effective value and where it
// came from (docs/configuration.md lists them all).
struct Setting {
  std::string variable;  // FERRY_...
  std::string option;    // what it sets: a ContextOptions field, a transport's option, ...
  std::string value;     // effective, as text
  std::string source;    // "default" or "environment"
};

std::string bytes_text(uint64_t bytes) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.2f GiB (%llu)", static_cast<double>(bytes) / (1ull << 30),
                static_cast<unsigned long long>(bytes));
  return text;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out.empty() ? "none" : out;
}

std::vector<Setting> settings_of(const ContextOptions& o) {
  const auto rdma_options = o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName);
  const auto tcp_options = o.transport_options_for<tcp::TcpOptions>(tcp::kTransportName);
  const auto cma_options = o.transport_options_for<cma::CmaOptions>(cma::kTransportName);
  const auto or_none = [](const std::string& v, const char* none) { return v.empty() ? none : v; };
  std::vector<Setting> out = {
      {"FERRY_TRANSPORT", "transport", o.transport, ""},
      {"FERRY_SECRET", "secret", o.secret.empty() ? "none (no authentication)" : "set (hidden)",
       ""},
      {"FERRY_TLS_CERT", "tls.certificate", or_none(o.tls.certificate, "none"), ""},
      {"FERRY_TLS_KEY", "tls.private_key", or_none(o.tls.private_key, "none"), ""},
      {"FERRY_TLS_CA", "tls.ca", or_none(o.tls.ca, "none"), ""},
      {"FERRY_RDMA_GRANTS", "rdma_grants", rdma::rdma_grants_name(rdma_options.grants), ""},
      {"FERRY_RDMA_MAX_REGISTRATION", "rdma_max_registration",
       rdma_options.max_registration ? std::to_string(rdma_options.max_registration) + " bytes"
                                     : std::string("0 (the device's own limit)"),
       ""},
      {"FERRY_RDMA_FORK_PROTECTION", "rdma_fork_protection",
       rdma_options.fork_protection ? "yes (libibverbs' fork protection on a kernel that needs it)"
                                    : "no (a warning where forks are unsafe)",
       ""},
      {"FERRY_TCP_CONGESTION", "tcp_congestion",
       or_none(tcp_options.congestion, "automatic (reno within one host, else the system's)"), ""},
      {"FERRY_CMA_PREFERRED", "cma_preferred",
       cma_options.preferred ? "yes (auto picks CMA for peers on this host)"
                             : "no (CMA only when asked for by name)",
       ""},
      {"FERRY_POOL_BYTES", "pool_bytes",
       o.pool_bytes ? bytes_text(o.pool_bytes) : std::string("0 (receive pool off)"), ""},
      {"FERRY_POOL_POPULATE_THREADS", "pool_populate_threads",
       std::to_string(o.pool_populate_threads) + " (at most one per core and per 4 MiB)", ""},
      {"FERRY_IO_SPIN_US", "idle_spin",
       o.idle_spin.count() > 0
           ? std::to_string(o.idle_spin.count()) + " us (an io thread polls that long after work)"
           : std::string("0 (io threads sleep as soon as they are idle)"),
       ""},
      {"FERRY_LOG", "log level", std::string(log::level_name(log::current_level())), ""},
  };
  for (auto& s : out) s.source = std::getenv(s.variable.c_str()) ? "environment" : "default";
  return out;
}

// How this binary was built.
std::string build_text() {
#ifdef NDEBUG
  std::string text = "optimized (NDEBUG)";
#else
  std::string text = "debug (assertions on)";
#endif
  text += rdma::compiled_in() ? ", RDMA compiled in (libibverbs, librdmacm)"
                              : ", RDMA not compiled in (libibverbs-dev was missing)";
  text += ", TLS: built with ";
  text += OPENSSL_VERSION_TEXT;
  return text;
}

// Whether a registered transport runs in a default context, and if not, why.
std::string state_of(const RegisteredTransport& t, const std::vector<std::string>& instantiated,
                     const std::vector<rdma::DeviceInfo>& devices) {
  for (const auto& name : instantiated) {
    if (name == t.name) return "on";
  }
  if (t.name == "RDMA") {
    if (!rdma::compiled_in()) return "off: RDMA not compiled in";
    if (devices.empty()) {
      return "off: no RDMA device (soft-RoCE: rdma link add rxe0 type rxe netdev IFACE; "
             "docs/rdma.md)";
    }
    return "off: devices found but none could be opened (FERRY_LOG=info says why)";
  }
  return "off: it did not start (FERRY_LOG=info says why)";
}

void print_text(const std::vector<RegisteredTransport>& registered,
                const std::vector<std::string>& instantiated,
                const std::vector<rdma::DeviceInfo>& devices,
                const std::vector<Setting>& settings) {
  std::printf("ferry %s\n", kVersion);
  std::printf("build: %s\n", build_text().c_str());
  std::printf("transports (the memory each moves; state in a default context):\n");
  for (const auto& t : registered) {
    std::printf("  %-8s memory: %-6s %s\n", t.name.c_str(), join(t.devices).c_str(),
                state_of(t, instantiated, devices).c_str());
  }
  if (registered.empty()) std::printf("  none\n");
  if (rdma::compiled_in()) std::printf("RDMA and fork(): %s\n", rdma::fork_safety_text().c_str());
  std::printf("RDMA devices:%s\n", devices.empty() ? " none" : "");
  for (const auto& dev : devices) {
    std::printf("  %s\n", dev.name.c_str());
    for (const auto& port : dev.ports) {
      std::printf("    port %u: %s, %s\n", static_cast<unsigned>(port.port), port.state.c_str(),
                  port.link_layer.c_str());
      for (const auto& gid : port.gids) std::printf("      gid %s\n", gid.c_str());
    }
  }
  std::printf("settings of a default context (docs/configuration.md):\n");
  for (const auto& st : settings) {
    std::printf("  %-27s %-21s %-11s %s\n", st.variable.c_str(), st.option.c_str(),
                st.source.c_str(), st.value.c_str());
  }
}

void print_json(const std::vector<RegisteredTransport>& registered,
                const std::vector<std::string>& instantiated,
                const std::vector<rdma::DeviceInfo>& devices,
                const std::vector<Setting>& settings) {
  auto strings = [](const std::vector<std::string>& items) {
    return boost::json::array(items.begin(), items.end());
  };
  boost::json::array transports;
  for (const auto& t : registered) {
    transports.push_back(boost::json::object{{"name", t.name},
                                             {"devices", strings(t.devices)},
                                             {"state", state_of(t, instantiated, devices)}});
  }
  boost::json::array rdma_devices;
  for (const auto& dev : devices) {
    boost::json::array ports;
    for (const auto& port : dev.ports) {
      ports.push_back(boost::json::object{{"port", uint64_t{port.port}},
                                          {"state", port.state},
                                          {"link_layer", port.link_layer},
                                          {"gids", strings(port.gids)}});
    }
    rdma_devices.push_back(boost::json::object{{"name", dev.name}, {"ports", std::move(ports)}});
  }
  boost::json::array setting_list;
  for (const auto& st : settings) {
    setting_list.push_back(boost::json::object{{"variable", st.variable},
                                               {"option", st.option},
                                               {"value", st.value},
                                               {"source", st.source}});
  }
  const boost::json::object doc{{"version", kVersion},
                                {"build", build_text()},
                                {"registered_transports", std::move(transports)},
                                {"context_transports", strings(instantiated)},
                                {"rdma",
                                 {{"compiled_in", rdma::compiled_in()},
                                  {"fork", rdma::fork_safety_text()},
                                  {"devices", std::move(rdma_devices)}}},
                                {"settings", std::move(setting_list)}};
  std::fputs(pretty_json(doc).c_str(), stdout);
}

}  // namespace

int run_info(bool json, ContextOptions options) {
  auto ctx = Context::create(std::move(options));
  if (!ctx) {
    const int rc = fail(kExitUsage, "create a default context", ctx.error());
    if (json) std::fputs(failure_json().c_str(), stdout);
    return rc;
  }
  const auto instantiated = (*ctx)->transports();
  const auto settings = settings_of((*ctx)->options());
  (*ctx)->close();
  const auto registered = registered_transports();
  const auto devices = rdma::list_devices();
  if (json) {
    print_json(registered, instantiated, devices, settings);
  } else {
    print_text(registered, instantiated, devices, settings);
  }
  return kExitOk;
}

}  // namespace ferry::cli
