#include "ferry/cma/copier.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <latch>
#include <vector>

#include "ferry/cma/process_memory.h"
#include "ferry/net/system/cpus.h"

namespace ferry::cma {
namespace {

// Below this a share costs more to hand over than to copy: waking a helper takes tens of us on a
// VM, about what one thread needs to copy 512 KiB (1 MiB objects: 196-202 us a fetch copied by
// one thread against 226 us split in two, 2-core VM).
constexpr size_t kMinShare = 1u << 20;

}  // namespace

unsigned default_copy_threads() { return std::min(usable_cores(), 8u); }

Copier::Copier(unsigned threads) : threads_(std::max(threads, 1u)) {
  if (threads_ > 1) helpers_ = std::make_unique<boost::asio::thread_pool>(threads_ - 1);
}

Copier::~Copier() {
  if (helpers_) helpers_->join();
}

std::error_code Copier::read(pid_t pid, std::byte* local, uint64_t remote, size_t n) {
  const size_t shares = std::clamp<size_t>(n / kMinShare, 1, threads_);
  if (shares == 1) return read_process_memory(pid, local, remote, n);
  const size_t share = (n + shares - 1) / shares;
  std::vector<std::error_code> errors(shares);
  std::latch done(static_cast<std::ptrdiff_t>(shares - 1));
  for (size_t i = 1; i < shares; ++i) {
    const size_t off = i * share;
    const size_t len = std::min(share, n - off);
    boost::asio::post(*helpers_, [&, i, off, len] {
      errors[i] = read_process_memory(pid, local + off, remote + off, len);
      done.count_down();
    });
  }
  errors[0] = read_process_memory(pid, local, remote, std::min(share, n));
  done.wait();  // every helper is done with `local` before this returns
  for (const auto& ec : errors) {
    if (ec) return ec;
  }
  return {};
}

}  // namespace ferry::cma
