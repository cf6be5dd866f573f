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

// Names the calling thread `name` (15 characters at most, as name_thread): for a thread ferry
// does not start but runs for ferry (the Python package's completion thread).
inline void name_this_thread(const char* name) { ::pthread_setname_np(::pthread_self(), name); }

// While it lives, threads the calling thread starts are named `name` (a thread starts with its
// creator's name): for threads ferry does not start itself (a boost::asio::thread_pool's). The
// calling thread gets its own name back when it ends. On the calling thread only.
class NameThreadsStartedHere {
 public:
  explicit NameThreadsStartedHere(const char* name) {
    restore_ = ::pthread_getname_np(::pthread_self(), saved_, sizeof saved_) == 0;
    name_this_thread(name);
  }
  ~NameThreadsStartedHere() {
    if (restore_) name_this_thread(saved_);
  }
  NameThreadsStartedHere(const NameThreadsStartedHere&) = delete;
  NameThreadsStartedHere& operator=(const NameThreadsStartedHere&) = delete;

 private:
  char saved_[16] = {};
  bool restore_ = false;
};

}  // namespace ferry
