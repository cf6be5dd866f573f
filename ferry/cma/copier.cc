#include "ferry/cma/copier.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <latch>
#include <new>
#include <vector>

#include "ferry/cma/process_memory.h"
#include "ferry/net/system/cpus.h"
#include "ferry/net/system/thread_name.h"

namespace ferry::cma {
namespace {

// Below this a share costs more to hand over than to copy: waking a helper takes tens of us on a
// VM, about what one thread needs to copy 512 KiB (1 MiB objects: 196-202 us a fetch copied by
// one thread against 226 us split in two, 2-core VM).
constexpr size_t kMinShare = 1u << 20;

}  // namespace

unsigned default_copy_threads() { return std::min(usable_cores(), 8u); }

Copier::Copier(unsigned threads) : threads_(std::max(threads, 1u)) {
  if (threads_ > 1) {
    const NameThreadsStartedHere named("ferry-copy");
    helpers_ = std::make_unique<boost::asio::thread_pool>(threads_ - 1);
  }
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
  const auto copy_share = [&](size_t i) {
    const size_t off = i * share;
    errors[i] = read_process_memory(pid, local + off, remote + off, std::min(share, n - off));
  };
  size_t posted = 1;
  try {
    for (; posted < shares; ++posted) {
      boost::asio::post(*helpers_, [&, i = posted] {
        copy_share(i);
        done.count_down();
      });
    }
  } catch (const std::bad_alloc&) {
    // A share that could not be handed over is copied here: the helpers already posted use
    // `errors`, `done` and `local`, so this must not return before they are done.
    for (size_t i = posted; i < shares; ++i) {
      copy_share(i);
      done.count_down();
    }
  }
  copy_share(0);
  done.wait();  // every helper is done with `local` before this returns
  for (const auto& ec : errors) {
    if (ec) return ec;
  }
  return {};
}

}  // namespace ferry::cma
