#include "ferry/cma/process_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

namespace ferry::cma {

std::string host_identity() {
  // Read once per process (a context each makes a transport): neither changes while it runs.
  static const std::string identity = [] {
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(boot, id);
    char ns[64] = {};
    const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    return id + "/" + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string("?"));
  }();
  return identity;
}

std::error_code read_process_memory(pid_t pid, std::byte* local, uint64_t remote, size_t n) {
  while (n > 0) {
    iovec to{local, n};
    iovec from{reinterpret_cast<void*>(remote), n};
    const ssize_t got = process_vm_readv(pid, &to, 1, &from, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return {errno, std::system_category()};
    }
    if (got == 0) return {EFAULT, std::system_category()};  // nothing readable at `remote`
    // A partial read stops at a page the other process does not map: the next call says so.
    local += got;
    remote += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return {};
}

}  // namespace ferry::cma
