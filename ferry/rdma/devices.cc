#include "ferry/rdma/devices.h"

#if FERRY_HAS_RDMA
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <memory>

#include "ferry/rdma/fork_safety.h"
#endif

namespace ferry::rdma {

bool compiled_in() { return FERRY_HAS_RDMA != 0; }

bool any_device() {
#if FERRY_HAS_RDMA
  int n = 0;
  if (ibv_device** list = ibv_get_device_list(&n)) ibv_free_device_list(list);
  return n > 0;
#else
  return false;
#endif
}

std::string fork_safety_text() {
#if FERRY_HAS_RDMA
  switch (fork_safety_now()) {
    case ForkSafety::kernel_copies:
      return "safe: the kernel copies pinned pages at fork";
    case ForkSafety::libibverbs_protects:
      return "safe: libibverbs' fork protection is on (children have no mapping of registered "
             "memory)";
    case ForkSafety::unprotected:
      break;
  }
  if (!any_device()) {
    return "not known without an RDMA device (libibverbs learns whether the kernel copies pinned "
           "pages at fork from the kernel's RDMA core)";
  }
  return "UNSAFE: a fork of a process with RDMA transfers can corrupt them silently; set "
         "FERRY_RDMA_FORK_PROTECTION=1 or RDMAV_FORK_SAFE=1, or start children with spawn/exec";
#else
  return "";
#endif
}

#if FERRY_HAS_RDMA
namespace {

const char* port_state_name(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    default:
      return "OTHER";
  }
}

}  // namespace

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  int n = 0;
  std::unique_ptr<ibv_device*, decltype(&ibv_free_device_list)> list(ibv_get_device_list(&n),
                                                                     &ibv_free_device_list);
  if (!list) return out;
  for (int i = 0; i < n; ++i) {
    DeviceInfo dev;
    dev.name = ibv_get_device_name(list.get()[i]);
    std::unique_ptr<ibv_context, decltype(&ibv_close_device)> ctx(ibv_open_device(list.get()[i]),
                                                                  &ibv_close_device);
    if (ctx) {
      ibv_device_attr attr{};
      if (ibv_query_device(ctx.get(), &attr) == 0) {
        for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
          ibv_port_attr pa{};
          if (ibv_query_port(ctx.get(), p, &pa) != 0) continue;
          PortInfo port;
          port.port = p;
          port.state = port_state_name(pa.state);
          port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
          for (int g = 0; g < pa.gid_tbl_len && g < 16; ++g) {
            ibv_gid gid{};
            if (ibv_query_gid(ctx.get(), p, g, &gid) != 0) continue;
            bool zero = true;
            for (auto b : gid.raw) zero = zero && b == 0;
            if (zero) continue;
            char text[INET6_ADDRSTRLEN] = {};
            inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
            port.gids.push_back(std::to_string(g) + ":" + text);
          }
          dev.ports.push_back(std::move(port));
        }
      }
    }
    out.push_back(std::move(dev));
  }
  return out;
}
#else
std::vector<DeviceInfo> list_devices() { return {}; }
#endif

}  // namespace ferry::rdma
