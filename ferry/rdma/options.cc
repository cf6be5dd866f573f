#include "ferry/rdma/options.h"

#include <string>
#include <utility>

#include "ferry/mem/pool.h"
#include "ferry/net/log.h"
#include "ferry/net/system/env.h"

namespace ferry::rdma {
namespace {

constexpr std::pair<RdmaGrants, const char*> kGrantNames[] = {
    {RdmaGrants::automatic, "auto"},
    {RdmaGrants::windows, "windows"},
    {RdmaGrants::registrations, "registrations"},
    {RdmaGrants::regions, "regions"},
};

}  // namespace

std::optional<RdmaGrants> parse_rdma_grants(std::string_view text) {
  for (const auto& [grants, name] : kGrantNames) {
    if (text == name) return grants;
  }
  return std::nullopt;
}

const char* rdma_grants_name(RdmaGrants grants) {
  for (const auto& [g, name] : kGrantNames) {
    if (g == grants) return name;
  }
  return "?";
}

RdmaOptions RdmaOptions::from_environment() {
  RdmaOptions o;
  if (const std::string v = env_text("FERRY_RDMA_GRANTS"); !v.empty()) {
    if (auto g = parse_rdma_grants(v)) {
      o.grants = *g;
    } else {
      FERRY_LOG_WARN("FERRY_RDMA_GRANTS={} is not auto, windows, registrations or regions: auto",
                     v);
    }
  }
  if (const std::string v = env_text("FERRY_RDMA_MAX_REGISTRATION"); !v.empty()) {
    if (auto bytes = mem::parse_byte_count(v)) {
      o.max_registration = *bytes;
    } else {
      FERRY_LOG_WARN(
          "FERRY_RDMA_MAX_REGISTRATION={} is not a byte count (such as 268435456 or 256M): the "
          "device's own limit",
          v);
    }
  }
  o.fork_protection = env_flag("FERRY_RDMA_FORK_PROTECTION", o.fork_protection);
  return o;
}

}  // namespace ferry::rdma
