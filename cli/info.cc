#include "cli/info.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <openssl/opensslv.h>

#include "cli/json.h"
#include "cli/status.h"
#include "ferry/ferry.h"
#include "ferry/net/log.h"

namespace ferry::cli {
namespace {

// One setting a default context takes from the environment: its effective value and where it
// came from (docs/configuration.md lists them all).
struct Setting {
  std::string variable;  // FERRY_...
  std::string option;    // the ContextOptions field (or what reads it)
  std::string value;     // effective, as text
  std::string source;    // "default" or "environment"
};

std::string bytes_text(uint64_t bytes) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.2f GiB (%llu)", static_cast<double>(bytes) / (1ull << 30),
                static_cast<unsigned long long>(bytes));
  return text;
}

const char* grants_text(RdmaGrants g) {
  switch (g) {
    case RdmaGrants::automatic:
      return "auto";
    case RdmaGrants::windows:
      return "windows";
    case RdmaGrants::registrations:
      return "registrations";
    case RdmaGrants::regions:
      return "regions";
  }
  return "?";
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
  const auto or_none = [](const std::string& v, const char* none) { return v.empty() ? none : v; };
  std::vector<Setting> out = {
      {"FERRY_TRANSPORT", "transport", o.transport, ""},
      {"FERRY_SECRET", "secret", o.secret.empty() ? "none (no authentication)" : "set (hidden)",
       ""},
      {"FERRY_TLS_CERT", "tls.certificate", or_none(o.tls.certificate, "none"), ""},
      {"FERRY_TLS_KEY", "tls.private_key", or_none(o.tls.private_key, "none"), ""},
      {"FERRY_TLS_CA", "tls.ca", or_none(o.tls.ca, "none"), ""},
      {"FERRY_RDMA_GRANTS", "rdma_grants", grants_text(o.rdma_grants), ""},
      {"FERRY_TCP_CONGESTION", "tcp_congestion",
       or_none(o.tcp_congestion, "automatic (reno within one host, else the system's)"), ""},
      {"FERRY_POOL_BYTES", "pool_bytes",
       o.pool_bytes ? bytes_text(o.pool_bytes) : std::string("0 (receive pool off)"), ""},
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
    std::printf("  %-21s %-16s %-11s %s\n", st.variable.c_str(), st.option.c_str(),
                st.source.c_str(), st.value.c_str());
  }
}

void print_json(const std::vector<RegisteredTransport>& registered,
                const std::vector<std::string>& instantiated,
                const std::vector<rdma::DeviceInfo>& devices,
                const std::vector<Setting>& settings) {
  auto strings = [](JsonWriter& w, const std::vector<std::string>& items) {
    w.begin_array();
    for (const auto& item : items) w.value(item);
    w.end_array();
  };
  JsonWriter w;
  w.begin_object().key("version").value(kVersion).key("build").value(build_text());
  w.key("registered_transports").begin_array();
  for (const auto& t : registered) {
    w.begin_object().key("name").value(t.name).key("devices");
    strings(w, t.devices);
    w.key("state").value(state_of(t, instantiated, devices));
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
  w.end_array().end_object();
  w.key("settings").begin_array();
  for (const auto& st : settings) {
    w.begin_object().key("variable").value(st.variable).key("option").value(st.option);
    w.key("value").value(st.value).key("source").value(st.source).end_object();
  }
  w.end_array().end_object();
  std::fputs(w.str().c_str(), stdout);
}

}  // namespace

int run_info(bool json) {
  auto ctx = Context::create();
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
