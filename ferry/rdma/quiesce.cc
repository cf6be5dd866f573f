#include "ferry/rdma/quiesce.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "ferry/net/log.h"
#include "ferry/rdma/post_back.h"

namespace ferry::rdma {
namespace {

// Runs `fn` unless `gate` has closed (always without one), under its lock: what `fn` touches of
// the loop (a timer, an executor) exists while it runs.
template <typename Fn>
void while_loop_lives(const std::shared_ptr<LoopGate>& gate, Fn fn) {
  if (!gate) return fn();
  gate->while_open(fn);
}

}  // namespace

std::function<void()> QuiesceBoard::add(const void* peer,
                                        const boost::asio::any_io_executor& executor,
                                        std::chrono::milliseconds bound) {
  {
    std::lock_guard lock(mu_);
    ++peers_[peer].pending;
  }
  auto said = std::make_shared<std::atomic<bool>>(false);
  auto self = shared_from_this();
  auto timer = std::make_shared<boost::asio::steady_timer>(executor, bound);
  // Once quiet, the bound's timer is cancelled on its executor (the reaper's thread may not
  // touch it): a pending timer would keep the context's loop from running out of work when it
  // closes.
  auto once = [self, peer, said, weak = std::weak_ptr(timer)] {
    if (said->exchange(true)) return;
    self->quiet(peer);
    while_loop_lives(self->loop_gate_, [&] {
      auto t = weak.lock();
      if (!t) return;
      boost::asio::post(t->get_executor(), [weak] {
        if (auto t = weak.lock()) t->cancel();
      });
    });
  };
  timer->async_wait([timer, once, said, bound](boost::system::error_code ec) {
    if (ec || said->load()) return;
    FERRY_LOG_WARN(
        "rdma: a queue pair that failed or closed with READs posted is not destroyed {} ms "
        "later: its fetches complete and a new pair to its peer is set up without waiting for it "
        "any longer",
        bound.count());
    once();
  });
  return once;
}

void QuiesceBoard::when_quiet(PeerLink& link, std::function<void()> then) {
  const void* peer = &link;
  then = [gate = loop_gate_, weak = std::weak_ptr(link.shared_link()),
          then = std::move(then)]() mutable {
    auto session = weak.lock();
    if (!session) return void(then = nullptr);  // the peer it was for has no session any more
    if (session->strand().running_in_this_thread()) return then();
    post_back(gate, std::move(session), std::move(then));
  };
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      it->second.waiters.push_back(std::move(then));
      return;
    }
  }
  then();
}

void QuiesceBoard::quiet(const void* peer) {
  std::vector<std::function<void()>> waiters;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end() || --it->second.pending > 0) return;
    waiters = std::move(it->second.waiters);
    peers_.erase(it);
  }
  for (auto& w : waiters) w();
}

}  // namespace ferry::rdma
