// Reading another process's memory on this host (cross-memory attach, process_vm_readv), and
// the identity of the host as processes that can do so share it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

namespace ferry::cma {

// This host as the kernel sees it: its boot id and this process's pid namespace. Two processes
// with the same identity address each other by pid. Any thread.
std::string host_identity();

// Copies `n` bytes at address `remote` of process `pid` to `local`, whole or not at all: the
// kernel's errno otherwise (EPERM: the kernel does not let this process read that one, e.g.
// kernel.yama.ptrace_scope or another user; ESRCH: it is gone; EFAULT: the range is not mapped
// there). Blocks for the copy only. Any thread.
std::error_code read_process_memory(pid_t pid, std::byte* local, uint64_t remote, size_t n);

}  // namespace ferry::cma
