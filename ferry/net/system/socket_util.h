// Small socket helpers shared by the core and the transports.
#pragma once

#include <fcntl.h>

namespace ferry {

// Marks a descriptor close-on-exec. Asio opens and accepts sockets without it, so a process the
// application spawns would inherit ferry's connections and keep them open after this process
// closes them or dies: peers would then notice only by heartbeat. Every socket ferry opens or
// accepts goes through this (a fork racing the open itself can still inherit one).
inline void close_on_exec(int fd) {
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

}  // namespace ferry
