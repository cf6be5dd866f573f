// Copier: copies out of another process's memory with several threads at once (internal to the
// CMA transport). One thread reads about 4-5 GB/s through process_vm_readv; a step split across
// the machine's cores reads at memory speed.
#pragma once

#include <sys/types.h>

#include <boost/asio/thread_pool.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

namespace ferry::cma {

class Copier {
 public:
  // `threads`: how many copy one step, the caller's thread included (helpers: threads - 1).
  explicit Copier(unsigned threads);
  ~Copier();  // joins the helpers
  Copier(const Copier&) = delete;
  Copier& operator=(const Copier&) = delete;

  // Copies `n` bytes at `remote` in process `pid` to `local`: the calling thread copies one
  // share, helpers the others; returns once every share is done (so nothing touches `local`
  // after it returns), with the first share's error if any (read_process_memory's errnos).
  // Any thread; blocks for the copy only.
  std::error_code read(pid_t pid, std::byte* local, uint64_t remote, size_t n);

  unsigned threads() const { return threads_; }

 private:
  unsigned threads_;
  std::unique_ptr<boost::asio::thread_pool> helpers_;  // null with one thread
};

// The default of CmaOptions::copy_threads: the cores this process may run on (usable_cores), 1
// to 8.
unsigned default_copy_threads();

}  // namespace ferry::cma
