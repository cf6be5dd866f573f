#include "ferry/collective/call.h"

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry::collective {

using std::chrono::milliseconds;

void copy_into(std::span<std::byte> to, std::span<const std::byte> from) {
  if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
}

milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(
                                       deadline - std::chrono::steady_clock::now()));
}

// What one call offered, shared with the store's hooks (which can run after the call). Every
// offer is for one rank, which fetches it once: the call ends when every offer has been sent
// (PutOptions::on_sent: over TCP written, over RDMA read and released) and no rank needs
// anything more from this one. Then the offers are withdrawn, and the call returns once the
// store has collected them: memory that an offer views must not be freed or reused before, or a
// registration cache could hand the stale registration (old pages) to the next object at the
// same address.
struct Call::Offers {
  struct Entry {
    std::string tag;
    int rank;  // who fetches it
    bool sent = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Entry> entries;  // deque: hooks hold pointers to entries as others are added
  int live = 0;               // offers not collected yet
};

Call::Call(Group& group, std::string what, size_t bytes)
    : Call(group, std::move(what), bytes, Clock::now() + group.options_.timeout) {}

Call::Call(Group& group, std::string what, size_t bytes, Clock::time_point deadline)
    : group_(group),
      what_(std::move(what)),
      seq_(++group.seq_),
      deadline_(deadline),
      offers_(std::make_shared<Offers>()) {
  const GroupOptions& options = group_.options_;
  if (options.busy_wait && bytes < group_.busy_wait_below_) {
    busy_ = Context::BusyPoll(group_.ctx_, options.busy_linger);
  } else {
    Context::BusyPoll::resume(group_.ctx_);  // the io threads run this call
  }
  group_.start_watches();
}

Call::~Call() {
  for (const auto& ref : offered_) group_.ctx_.release(ref);
  const auto bound = group_.ctx_.options().lease_timeout + milliseconds(1000);
  const auto until = Clock::now() + bound;
  const auto collected = [&] { return offers_->live == 0; };
  while (!offers_are(collected) && Clock::now() < until) pause_on_offers(collected);
  if (!offers_are(collected)) {
    std::lock_guard lock(offers_->mu);
    FERRY_LOG_WARN("collective: {} #{}: {} offers still held by peers after {} ms", what_, seq_,
                   offers_->live, bound.count());
  }
}

int Call::rank() const { return group_.rank_; }

int Call::size() const { return group_.size(); }

const GroupOptions& Call::options() const { return group_.options_; }

std::vector<int> Call::others() const {
  std::vector<int> out;
  for (int q = 0; q < size(); ++q) {
    if (q != rank()) out.push_back(q);
  }
  return out;
}

bool Call::combines_as_it_arrives(int q) const { return group_.peers_[q].combines_as_it_arrives(); }

Result<std::span<std::byte>> Call::scratch(size_t bytes) {
  auto& g = group_;
  if (g.scratch_bytes_ < bytes || !g.scratch_) {
    g.scratch_.reset();  // the old block goes back to the pool first: it may serve the new one
    g.scratch_bytes_ = 0;
    auto block = g.ctx_.allocate(std::max<size_t>(bytes, 1));
    if (!block) return block.error();
    g.scratch_ = std::move(*block);
    g.scratch_bytes_ = bytes;
  }
  return std::span(g.scratch_.get(), g.scratch_bytes_);
}

// With busy waiting this thread runs the context between checks (Context::BusyPoll: its io
// threads are parked): it polls, yielding the core when nothing was ready, and once busy_spin
// has passed with nothing, sleeps in the reactor until the next event (at most 1 ms: an io
// thread that had not parked yet can run a handler that makes `ready` true without waking this
// one). Otherwise it calls `sleep`, which returns early when woken.
template <typename Ready, typename Sleep>
void Call::pause(Ready ready, Sleep sleep) {
  if (!busy_) return sleep(milliseconds(5));
  auto now = Clock::now();
  const auto until = now + milliseconds(5);
  const auto spin = group_.options_.busy_spin;
  auto spin_until = now + spin;
  while (!ready() && (now = Clock::now()) < until) {
    if (now < spin_until) {
      if (busy_.poll() == 0) sched_yield();
    } else {
      const auto nap = std::min<Clock::duration>(until - now, milliseconds(1));
      if (busy_.poll_or_wait(std::chrono::duration_cast<std::chrono::microseconds>(nap)) > 0) {
        spin_until = Clock::now() + spin;  // something happened: spin again
      }
    }
  }
}

template <typename Ready>
bool Call::offers_are(Ready ready) {
  std::lock_guard lock(offers_->mu);
  return ready();
}

template <typename Ready>
void Call::pause_on_offers(Ready ready) {
  pause([&] { return offers_are(ready); },
        [&](milliseconds t) {
          std::unique_lock lock(offers_->mu);
          offers_->cv.wait_for(lock, t, ready);
        });
}

void Call::settle(const FetchRequest& req, Clock::time_point until) {
  while (!req.done() && Clock::now() < until) {
    pause([&] { return req.done(); }, [&](milliseconds t) { req.wait(t); });
  }
}

std::string Call::name(const std::string& tag, int owner, int to) const {
  return "ferry.collective/" + group_.options_.name + "/" + std::to_string(seq_) + "/" + tag + "/" +
         std::to_string(owner) + (to >= 0 ? ">" + std::to_string(to) : "");
}

Status Call::offer(const std::string& tag, std::span<const std::byte> bytes,
                   const std::vector<int>& ranks, std::shared_ptr<void> memory) {
  for (int to : ranks) {
    PutOptions o;
    o.name = name(tag, rank(), to);
    Offers::Entry* entry;
    {
      std::lock_guard lock(offers_->mu);
      ++offers_->live;
      entry = &offers_->entries.emplace_back(Offers::Entry{tag, to});
    }
    o.on_sent = [s = offers_, entry] {
      std::lock_guard lock(s->mu);
      if (std::exchange(entry->sent, true)) return;  // fetched again after a failure
      s->cv.notify_all();
    };
    auto owner = std::shared_ptr<void>(nullptr, [s = offers_, memory](void*) {
      std::lock_guard lock(s->mu);
      --s->live;
      s->cv.notify_all();
    });
    auto ref = group_.ctx_.put({Tensor::bytes(bytes)}, std::move(owner), o);
    if (!ref) return fail(-1, ref.error(), "cannot offer " + o.name);
    offered_.push_back(*ref);
  }
  return {};
}

std::vector<int> Call::meet(const std::string& tag) {
  if (mark_as(name(tag, rank()))) return others();  // they cannot see this rank's marker
  std::vector<std::byte> sink(static_cast<size_t>(size()));
  for (int q : others()) take_named(q, name(tag, q), {&sink[q], 1}, {});
  std::vector<int> missing;
  for (auto& p : pending_) {
    settle(p.req, deadline_ + milliseconds(1000));
    if (p.req.outcome().value_or(make_error_code(errc::timed_out))) {
      missing.push_back(p.from);
    } else {
      count_restarts(p.req);
    }
  }
  // A marker fetch still in flight (its rank missed the deadline) writes into `sink` until it
  // ends: abort it and wait for that (bounded) before `sink` goes.
  for (auto& p : pending_) p.req.abort();
  for (auto& p : pending_) settle(p.req, Clock::now() + milliseconds(1000));
  pending_.clear();
  return missing;
}

std::error_code Call::mark_as(const std::string& object) {
  auto& g = group_;
  PutOptions o;
  o.name = object;
  auto ref = g.ctx_.put({Tensor::bytes({g.marker_.get(), 1})}, g.marker_, o);
  if (!ref) return ref.error();
  g.markers_.push_back(*ref);
  return {};
}

void Call::take(int from, const std::string& tag, std::span<std::byte> into, CombineFn combine) {
  take_named(from, name(tag, from, rank()), into, std::move(combine));
}

void Call::take_named(int from, const std::string& object, std::span<std::byte> into,
                      CombineFn combine) {
  pending_.push_back(
      {from, group_.fetch_named(from, object, into, left_until(deadline_), std::move(combine))});
}

size_t Call::taken() const { return pending_.size(); }

void Call::forget(size_t first) { pending_.resize(first); }

bool Call::sent(const std::string& tag) {
  return offers_are([&] {
    return std::all_of(offers_->entries.begin(), offers_->entries.end(),
                       [&](const Offers::Entry& e) { return e.sent || e.tag != tag; });
  });
}

// A fetch whose data channel broke under it (a queue pair flushed, stalled or reset by the
// owner) while its peer lives was started again by ferry itself (Peer::fetch, at most
// kMaxFetchRestarts times in a row without progress, within the deadline, resuming after the
// bytes that landed): the owner still offers it (an offer lasts
// until it has been sent to the rank it is for: over RDMA, until that rank's READs succeeded
// and it said so).
void Call::count_restarts(const FetchRequest& req) { group_.refetches_ += req.result().restarts; }

Status Call::wait(size_t i) {
  for (;;) {
    const int from = pending_[i].from;
    const FetchRequest& req = pending_[i].req;
    // The fetch's outcome, not wait()'s: a wait that runs out as the fetch completes returns
    // timed_out for a fetch that succeeded.
    pause([&] { return req.done(); }, [&](milliseconds t) { req.wait(t); });
    if (auto outcome = req.outcome()) {
      if (!*outcome) {
        count_restarts(req);
        return {};
      }
      return fail(from, *outcome, "fetch from rank " + std::to_string(from));
    }
    for (auto& other : pending_) {
      if (auto oec = other.req.outcome(); oec && *oec) {
        return fail(other.from, *oec, "fetch from rank " + std::to_string(other.from));
      }
    }
    if (auto s = check_watches(); !s) return s;
    if (Clock::now() > deadline_ + milliseconds(1000)) {
      req.abort();
      return fail(from, errc::timed_out, "fetch from rank " + std::to_string(from));
    }
  }
}

Status Call::wait_all() {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (auto s = wait(i); !s) return s;
  }
  pending_.clear();
  return {};
}

Status Call::finish() {
  if (auto s = wait_all(); !s) return s;
  const auto sent = [&] {
    return std::all_of(offers_->entries.begin(), offers_->entries.end(),
                       [](const Offers::Entry& e) { return e.sent; });
  };
  const auto& peers = group_.peers_;
  while (!offers_are(sent)) {
    pause_on_offers(sent);
    // An offer still owed, preferably to a rank that has closed.
    int q = -1;
    std::string tag;
    {
      std::lock_guard lock(offers_->mu);
      for (const auto& e : offers_->entries) {
        if (e.sent) continue;
        if (q < 0 || (peers[q].is_open() && !peers[e.rank].is_open())) {
          q = e.rank;
          tag = e.tag;
        }
      }
    }
    if (q < 0) break;  // all sent meanwhile
    const std::string doing = "waiting for rank " + std::to_string(q) + " to fetch " + tag;
    if (!peers[q].is_open()) return fail(q, errc::peer_closed, doing);
    if (auto s = check_watches(); !s) return s;
    if (Clock::now() > deadline_) return fail(q, errc::timed_out, doing);
  }
  return {};
}

Status Call::check_watches() {
  if (auto q = group_.failed_watch()) {
    return fail(*q, errc::aborted, "rank " + std::to_string(*q));
  }
  return {};
}

Status Call::fail(int rank, std::error_code ec, const std::string& doing) {
  auto& g = group_;
  Status s;
  s.ec = ec;
  s.rank = rank;
  s.message = what_ + " #" + std::to_string(seq_) + " on rank " + std::to_string(g.rank_) + ": " +
              doing + (rank >= 0 ? " (" + g.addresses_[rank] + ")" : "") +
              " failed: " + ec.message() +
              (ec == errc::size_mismatch && rank >= 0
                   ? " (this rank and that one passed tensors of different sizes: every "
                     "rank must pass the same size)"
                   : "");
  FERRY_LOG_WARN("collective: {}", s.message);
  // The marker stays offered while the (failed) group lives.
  mark_as(g.fail_marker(g.rank_));
  // Aborted fetches end promptly; a second from now at least, also when the call failed past its
  // deadline (the wait must still happen: their targets are freed after it).
  const auto until = std::max(deadline_, Clock::now()) + milliseconds(1000);
  g.end_watches(*this, until);
  for (auto& p : g.peers_) {
    if (p.valid()) p.close();
  }
  // Aborted fetches may still have READs in flight into their targets: the caller frees
  // those only once every fetch has completed (each is bounded by the call's deadline).
  for (auto& p : pending_) p.req.abort();
  for (auto& p : pending_) settle(p.req, until);
  pending_.clear();
  g.failed_ = s;
  return s;
}

}  // namespace ferry::collective
