#include "ferry/rdma/options.h"

#include <string>
#include <utility>

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
  const std::string v = env_text("FERRY_RDMA_GRANTS");
  if (v.empty()) return o;
  if (auto g = parse_rdma_grants(v)) {
    o.grants = *g;
  } else {
    FERRY_LOG_WARN("FERRY_RDMA_GRANTS={} is not auto, windows, registrations or regions: auto", v);
  }
  return o;
}

}  // namespace ferry::rdma
