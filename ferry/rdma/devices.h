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
/// True when libibverbs lists at least one device (false when not compiled in). Opens none and
/// registers nothing. Any thread.
bool any_device();
/// What a fork() of this process does to its RDMA transfers, in a sentence for people (`ferry
/// info`): safe because the kernel copies pinned pages at fork, safe because libibverbs' fork
/// protection is on, unsafe (with the remedy; docs/rdma.md, "fork()"), or not known (no device:
/// libibverbs learns it from the kernel's RDMA core). "" when RDMA is not compiled in. Asks
/// libibverbs, changes nothing. Any thread.
std::string fork_safety_text();

}  // namespace ferry::rdma
