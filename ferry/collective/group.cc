#include "ferry/collective/group.h"

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include "ferry/collective/algorithms/allgather_doubling.h"
#include "ferry/collective/algorithms/allreduce_doubling.h"
#include "ferry/collective/algorithms/allreduce_halving.h"
#include "ferry/collective/algorithms/direct.h"
#include "ferry/collective/algorithms/ring.h"
#include "ferry/collective/call.h"
#include "ferry/net/core/deadline.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/system/cpus.h"

namespace ferry::collective {
namespace {

using std::chrono::milliseconds;

bool is_power_of_two(int n) { return (n & (n - 1)) == 0; }

}  // namespace

// ---------------------------------------------------------------- forming the group

Group::Group(Context& ctx, std::vector<std::string> addresses, int rank, GroupOptions options)
    : ctx_(ctx), addresses_(std::move(addresses)), rank_(rank), options_(std::move(options)) {
  options_.timeout = bounded_timeout(options_.timeout);
  options_.join_timeout = bounded_timeout(options_.join_timeout);
  if (options_.busy_wait_below) {
    busy_wait_below_ = *options_.busy_wait_below;
  } else {
    const auto host = [](const std::string& address) {
      return address.substr(0, address.rfind(':'));
    };
    const auto here = host(addresses_[rank_]);
    const auto local = static_cast<unsigned>(std::count_if(
        addresses_.begin(), addresses_.end(), [&](const auto& a) { return host(a) == here; }));
    const bool spare = usable_cores() >= 2 * local;
    // 256 KiB per rank, at least 1 MiB: a call's messages shrink as the group grows, and below
    // about that a wake-up costs more than the overlap gains (docs/collectives.md, "Large
    // calls", where the threshold was measured).
    busy_wait_below_ = spare ? std::max<size_t>(size_t{1} << 20, size() * (size_t{256} << 10))
                             : std::numeric_limits<size_t>::max();
  }
}

Group::~Group() {
  for (auto& w : watches_) w.req.abort();
  const auto until = Clock::now() + ctx_.options().lease_timeout + milliseconds(1000);
  for (auto& w : watches_) w.req.wait(left_until(until));
  for (const auto& ref : markers_) ctx_.release(ref);
}

FetchRequest Group::fetch_named(int q, const std::string& object, std::span<std::byte> into,
                                milliseconds timeout, CombineFn combine) {
  auto ref = ObjectRef::named(addresses_[q], object, {TensorMeta::bytes(into.size())});
  // A call waits as GroupOptions say (busy_wait, busy_spin: measured with cores to spare), so
  // a wait of it that sleeps sleeps at once.
  // At least 1 ms: a timeout of 0 would mean none (a take made at the deadline waited for good).
  return peers_[q].fetch(std::move(ref), {into},
                         {.timeout = std::max(timeout, milliseconds(1)),
                          .combine = std::move(combine),
                          .wait_spin = std::chrono::microseconds(0)});
}

Status Group::connect_all(Clock::time_point deadline) {
  peers_.resize(addresses_.size());
  std::vector<int> missing;
  for (int q = 0; q < size(); ++q) {
    if (q == rank_) continue;
    // The other ranks may still be starting: retry until the join deadline.
    for (auto delay = milliseconds(10);; delay = std::min(delay * 2, milliseconds(500))) {
      auto peer = ctx_.connect(addresses_[q]);
      if (peer) {
        peers_[q] = *peer;
        break;
      }
      if (Clock::now() + delay >= deadline) {
        missing.push_back(q);
        break;
      }
      std::this_thread::sleep_for(delay);
    }
  }
  if (missing.empty()) return {};
  Status s;
  s.ec = errc::timed_out;
  s.rank = missing.front();
  s.message =
      "group '" + options_.name + "': rank " + std::to_string(rank_) + " could not reach rank(s)";
  for (int q : missing) s.message += " " + std::to_string(q) + " (" + addresses_[q] + ")";
  return s;
}

Result<std::unique_ptr<Group>> Group::join(Context& ctx, std::vector<std::string> addresses,
                                           int rank, GroupOptions options, Status* why) {
  auto report = [why](Status s) -> std::error_code {
    FERRY_LOG_WARN("collective: {}", s.message);
    if (why) *why = s;
    return s.ec;
  };
  if (rank < 0 || static_cast<size_t>(rank) >= addresses.size()) {
    return report({errc::invalid_argument, rank, "rank out of range"});
  }
  std::unique_ptr<Group> g(new Group(ctx, std::move(addresses), rank, std::move(options)));
  const auto deadline = Clock::now() + g->options_.join_timeout;
  if (auto s = g->connect_all(deadline); !s) return report(s);
  // Every rank offers "join" and fetches everyone else's, within the join deadline.
  Call call(*g, "join", 0, deadline);
  if (auto missing = call.meet("join"); !missing.empty()) {
    Status s{errc::timed_out, missing.front(),
             "group '" + g->options_.name + "': rank(s) did not join within the deadline:"};
    for (int q : missing) s.message += " " + std::to_string(q) + " (" + g->addresses_[q] + ")";
    return report(s);
  }
  return g;
}

// ---------------------------------------------------------------- watches

std::string Group::fail_marker(int q) const {
  return "ferry.collective/" + options_.name + "/fail/" + std::to_string(q);
}

FetchRequest Group::start_watch(int q) {
  return fetch_named(q, fail_marker(q), {&watch_sink_, 1}, options_.timeout);
}

void Group::start_watches() {
  if (std::exchange(watching_, true)) return;
  for (int q = 0; q < size(); ++q) {
    if (q != rank_) watches_.push_back({q, start_watch(q)});
  }
}

std::optional<int> Group::failed_watch() {
  for (auto it = watches_.begin(); it != watches_.end();) {
    auto oec = it->req.outcome();
    if (!oec) {
      ++it;
      continue;
    }
    if (!*oec) return it->rank;
    const bool broke =
        scope_of(*oec) == Scope::peer && peers_[it->rank].is_open() && it->restarts < 8;
    if (*oec == errc::timed_out || broke) {
      it->restarts += broke;
      refetches_ += broke;  // a watch is a fetch started again too (Group::refetches)
      it->req = start_watch(it->rank);
      ++it;
      continue;
    }
    // The rank is gone. If it died mid-call, the ranks that fetch from it or owe it an offer
    // fail and offer their fail markers, which this watch of theirs hears; if it left after
    // its part was done (a program that ends after its last call), nothing needs it. A fetch
    // from it or an offer owed to it still fails the call at once (Call::wait, Call::finish).
    it = watches_.erase(it);
  }
  return std::nullopt;
}

void Group::end_watches(Call& call, Clock::time_point until) {
  for (auto& w : watches_) w.req.abort();
  for (auto& w : watches_) call.settle(w.req, until);
  watches_.clear();
}

// ---------------------------------------------------------------- the collectives: checks and
// the choice of algorithm (algorithms/)

std::pair<size_t, size_t> Group::chunk_range(size_t count, int rank, int size) {
  const auto n = static_cast<size_t>(size);
  const auto r = static_cast<size_t>(rank);
  return {count * r / n, count * (r + 1) / n};
}

Status Group::allreduce(std::span<std::byte> data, DType dtype, ReduceOp op) {
  if (failed_) return *failed_;
  const size_t esize = dtype_size(dtype);
  if (esize == 0 || data.size() % esize) {
    return {errc::invalid_argument, -1, "allreduce: size is not whole elements of the dtype"};
  }
  Call call(*this, "allreduce", data.size());
  if (size() == 1) return {};
  if (data.size() < options_.doubling_threshold) return allreduce_doubling(call, data, dtype, op);
  if (data.size() >= options_.ring_threshold) return allreduce_ring(call, data, dtype, op);
  if (is_power_of_two(size())) return allreduce_halving(call, data, dtype, op);
  return allreduce_exchange(call, data, dtype, op);
}

Status Group::abandon(const std::string& what, std::error_code ec, const std::string& why) {
  if (failed_) return *failed_;
  Call call(*this, what, 0);
  return call.fail(-1, ec, why);
}

Status Group::broadcast(std::span<std::byte> data, int root) {
  if (failed_) return *failed_;
  if (root < 0 || root >= size()) return {errc::invalid_argument, root, "broadcast: bad root"};
  Call call(*this, "broadcast", data.size());
  if (size() == 1) return {};
  return broadcast_direct(call, data, root);
}

Status Group::allgather(std::span<const std::byte> in, std::span<std::byte> out) {
  if (failed_) return *failed_;
  if (out.size() != static_cast<size_t>(size()) * in.size()) {
    return {errc::invalid_argument, -1, "allgather: out must be size() * in.size() bytes"};
  }
  Call call(*this, "allgather", out.size());
  copy_into(out.subspan(static_cast<size_t>(rank_) * in.size()), in);
  if (size() == 1) return {};
  if (is_power_of_two(size())) return allgather_doubling(call, in, out);
  return allgather_direct(call, in, out);
}

Status Group::reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType dtype,
                             ReduceOp op) {
  if (failed_) return *failed_;
  const size_t esize = dtype_size(dtype);
  if (esize == 0 || in.size() % esize) {
    return {errc::invalid_argument, -1, "reduce_scatter: size is not whole elements"};
  }
  if (out.size() != chunk_of(in, in.size() / esize, esize, rank_, size()).size()) {
    return {errc::invalid_argument, -1, "reduce_scatter: out must be this rank's chunk"};
  }
  Call call(*this, "reduce_scatter", in.size());
  if (size() == 1) {
    copy_into(out, in);
    return {};
  }
  if (in.size() >= options_.ring_threshold) return reduce_scatter_ring(call, in, out, dtype, op);
  return reduce_scatter_direct(call, in, out, dtype, op);
}

}  // namespace ferry::collective
