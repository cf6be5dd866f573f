// The cores this process may run on: what sizes its helper threads and decides whether cores are
// to spare.
#pragma once

#include <sched.h>

#include <algorithm>
#include <thread>

namespace ferry {

// Cores in this process's affinity mask (taskset, a container's cpuset), at least 1; the
// machine's count when the mask cannot be read. Read at each call: the mask can change.
inline unsigned usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    return static_cast<unsigned>(std::max(CPU_COUNT(&set), 1));
  }
  return std::max(std::thread::hardware_concurrency(), 1u);
}

}  // namespace ferry
