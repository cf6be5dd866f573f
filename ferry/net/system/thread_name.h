// Names for ferry's own threads, as `top -H`, `ps -L`, gdb and perf show them.
#pragma once

#include <pthread.h>

#include <thread>

namespace ferry {

// Names `thread` `name` (15 characters at most are kept: the kernel's limit), from the thread
// that started it, so the name is there once the constructor that started it returns. A name that
// cannot be set leaves the thread unnamed; nothing else depends on it. Returns `thread`.
inline std::thread& name_thread(std::thread& thread, const char* name) {
  ::pthread_setname_np(thread.native_handle(), name);
  return thread;
}

}  // namespace ferry
