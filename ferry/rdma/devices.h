/// @file
/// RDMA device discovery, for `ferry info` and transport selection. The RDMA transport itself
/// is a separate piece of work; with FERRY_RDMA=OFF (or rdma-core absent) this lists nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::rdma {

/// One port of an RDMA device, as libibverbs reports it.
struct PortInfo {
  uint8_t port = 0;               ///< port number, from 1
  std::string state;              ///< "ACTIVE", "DOWN", ...
  std::string link_layer;         ///< "Ethernet" (RoCE), "InfiniBand"
  std::vector<std::string> gids;  ///< non-zero GIDs, as text
};

/// One RDMA device (list_devices()).
struct DeviceInfo {
  std::string name;             ///< the verbs device name ("rxe0", "mlx5_0", ...)
  std::vector<PortInfo> ports;  ///< its ports, in port order
};

/// True when this build has RDMA support compiled in.
bool compiled_in();
/// Devices visible to libibverbs (empty when none, or when not compiled in).
std::vector<DeviceInfo> list_devices();

}  // namespace ferry::rdma
