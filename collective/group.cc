#include "collective/group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "net/errors.h"
#include "net/log.h"

namespace ferry::collective {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Rank q's chunk (Group::chunk_range) of `count` elements of `esize` bytes.
template <typename Byte>
std::span<Byte> chunk_of(std::span<Byte> data, size_t count, size_t esize, int q, int n) {
  auto [first, last] = Group::chunk_range(count, q, n);
  return data.subspan(first * esize, (last - first) * esize);
}

milliseconds left_until(Clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

}  // namespace

// One collective call: what this rank offers (released when every rank is done) and what it
// fetches, under one deadline.
struct Group::Op {
  Op(Group& g, std::string what) : g(g), what(std::move(what)), seq(++g.seq_) {
    deadline = Clock::now() + g.options_.timeout;
  }
  ~Op() {
    for (const auto& ref : offered) g.ctx_.release(ref);
  }

  std::string name(const std::string& tag, int rank) const {
    return "ferry.collective/" + g.options_.name + "/" + std::to_string(seq) + "/" + tag + "/" +
           std::to_string(rank);
  }
  // Offers `bytes` (a view: the caller keeps them unchanged until every rank is done) as `tag`.
  Status offer(const std::string& tag, std::span<const std::byte> bytes,
               std::vector<ObjectRef>* keep = nullptr) {
    PutOptions o;
    o.name = name(tag, g.rank_);
    auto ref = g.ctx_.put({Tensor::bytes(bytes)}, nullptr, o);
    if (!ref) return fail(-1, ref.error(), "cannot offer " + o.name);
    (keep ? *keep : offered).push_back(*ref);
    return {};
  }
  // Starts fetching rank `from`'s `tag` into `into` (exactly its size).
  void take(int from, const std::string& tag, std::span<std::byte> into) {
    auto ref =
        ObjectRef::named(g.addresses_[from], name(tag, from), {TensorMeta::bytes(into.size())});
    pending.emplace_back(
        from, g.peers_[from].fetch(std::move(ref), {into}, {.timeout = left_until(deadline)}));
  }
  // Waits for the fetch at `i` of `pending`, but fails at once when any other pending fetch
  // has failed: a rank that gave up offers nothing more, and waiting on it in rank order would
  // hide the failure behind the deadline.
  Status wait(size_t i) {
    auto& [from, req] = pending[i];
    for (;;) {
      // The fetch's outcome, not wait()'s: a wait that runs out as the fetch completes returns
      // timed_out for a fetch that succeeded.
      req.wait(milliseconds(5));
      if (auto outcome = req.outcome()) {
        if (*outcome) return fail(from, *outcome, "fetch from rank " + std::to_string(from));
        return {};
      }
      for (auto& [q, other] : pending) {
        if (auto oec = other.outcome(); oec && *oec) {
          return fail(q, *oec, "fetch from rank " + std::to_string(q));
        }
      }
      if (Clock::now() > deadline + milliseconds(1000)) {
        req.abort();
        return fail(from, errc::timed_out, "fetch from rank " + std::to_string(from));
      }
    }
  }
  Status wait_all() {
    for (size_t i = 0; i < pending.size(); ++i) {
      if (auto s = wait(i); !s) return s;
    }
    pending.clear();
    return {};
  }
  // Fetches `tag` (mine.size() bytes) from every other rank and reduces the N parts into `out`
  // in rank order (this rank's own part is `mine`), each as soon as it and all before it have
  // arrived. `out` must not overlap `mine`.
  Status gather_reduce(const std::string& tag, std::span<const std::byte> mine, DType dtype,
                       ReduceOp op, std::span<std::byte> out) {
    if (mine.empty()) return {};
    const int n = g.size();
    std::vector<std::vector<std::byte>> theirs(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      if (q == g.rank_) continue;
      theirs[q].resize(mine.size());
      take(q, tag, theirs[q]);
    }
    size_t next = 0;  // into `pending`: the ranks in order, this one skipped
    for (int q = 0; q < n; ++q) {
      std::span<const std::byte> part = mine;
      if (q != g.rank_) {
        if (auto s = wait(next++); !s) return s;
        part = theirs[q];
      }
      if (q == 0) {
        std::memcpy(out.data(), part.data(), part.size());
      } else if (auto ec = reduce_into(dtype, op, out, part)) {
        return fail(-1, ec, "reduce");
      }
    }
    pending.clear();
    return {};
  }
  // Every rank offers a one-byte marker and fetches everyone else's: when it returns, every
  // rank has finished everything before it.
  // `gone_is_done`: a rank whose connection has closed counts as arrived (see finish).
  Status barrier(const std::string& tag, std::vector<ObjectRef>* keep = nullptr,
                 bool gone_is_done = false) {
    if (auto s = offer(tag, {&g.marker_, 1}, keep); !s) return s;
    std::vector<std::byte> sink(static_cast<size_t>(g.size()));
    for (int q = 0; q < g.size(); ++q) {
      if (q != g.rank_) take(q, tag, {&sink[q], 1});
    }
    if (!gone_is_done) return wait_all();
    for (auto& [from, req] : pending) {
      req.wait(left_until(deadline) + milliseconds(1000));
      const auto ec = req.outcome().value_or(make_error_code(errc::timed_out));
      if (ec && !(scope_of(ec) == Scope::peer && !g.peers_[from].is_open())) {
        return fail(from, ec, "barrier with rank " + std::to_string(from));
      }
    }
    pending.clear();
    return {};
  }
  // Ends the call: a barrier (every rank has fetched what this one offered), then the offers go.
  // The barrier's own marker lives until the next call's barrier. This rank's results are
  // complete before it: a rank that has already left (its connection closed after its own
  // barrier, e.g. at exit) no longer needs anything from this one, so it counts as arrived.
  Status finish() {
    std::vector<ObjectRef> marker;
    if (auto s = barrier("done", &marker, /*gone_is_done=*/true); !s) return s;
    for (const auto& ref : g.previous_markers_) g.ctx_.release(ref);
    g.previous_markers_ = std::move(marker);
    return {};
  }
  Status fail(int rank, std::error_code ec, const std::string& doing) {
    Status s;
    s.ec = ec;
    s.rank = rank;
    s.message = what + " #" + std::to_string(seq) + " on rank " + std::to_string(g.rank_) + ": " +
                doing + (rank >= 0 ? " (" + g.addresses_[rank] + ")" : "") +
                " failed: " + ec.message();
    FERRY_LOG_WARN("collective: {}", s.message);
    // Fail fast everywhere: closing our connections fails the other ranks' fetches from us now
    // instead of at their deadline.
    for (auto& p : g.peers_) {
      if (p.valid()) p.close();
    }
    for (auto& [from, req] : pending) req.abort();
    g.failed_ = s;
    return s;
  }

  Group& g;
  std::string what;
  uint64_t seq;
  Clock::time_point deadline;
  std::vector<ObjectRef> offered;
  std::vector<std::pair<int, FetchRequest>> pending;
};

// ---------------------------------------------------------------- forming the group

Group::Group(Context& ctx, std::vector<std::string> addresses, int rank, GroupOptions options)
    : ctx_(ctx), addresses_(std::move(addresses)), rank_(rank), options_(std::move(options)) {}

Group::~Group() {
  for (const auto& ref : previous_markers_) ctx_.release(ref);
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
  Op op(*g, "join");
  op.deadline = deadline;
  if (auto s = op.offer("join", {&g->marker_, 1}, &g->previous_markers_); !s) return report(s);
  std::vector<std::byte> sink(g->addresses_.size());
  std::vector<int> missing;
  for (int q = 0; q < g->size(); ++q) {
    if (q != rank) op.take(q, "join", {&sink[q], 1});
  }
  for (auto& [q, req] : op.pending) {
    if (req.wait(left_until(deadline) + milliseconds(1000))) missing.push_back(q);
  }
  op.pending.clear();
  if (!missing.empty()) {
    Status s{errc::timed_out, missing.front(),
             "group '" + g->options_.name + "': rank(s) did not join within the deadline:"};
    for (int q : missing) s.message += " " + std::to_string(q) + " (" + g->addresses_[q] + ")";
    return report(s);
  }
  return g;
}

std::pair<size_t, size_t> Group::chunk_range(size_t count, int rank, int size) {
  const auto n = static_cast<size_t>(size);
  const auto r = static_cast<size_t>(rank);
  return {count * r / n, count * (r + 1) / n};
}

// ---------------------------------------------------------------- collectives

Status Group::allreduce(std::span<std::byte> data, DType dtype, ReduceOp op) {
  if (!failed_) return failed_;
  const size_t esize = dtype_size(dtype);
  if (esize == 0 || data.size() % esize) {
    return {errc::invalid_argument, -1, "allreduce: size is not whole elements of the dtype"};
  }
  Op o(*this, "allreduce");
  const int n = size();
  if (n == 1) return {};
  if (data.size() < options_.direct_threshold) {
    // Direct: offer a snapshot (this rank rewrites `data`), fetch every tensor and reduce.
    std::vector<std::byte> mine(data.begin(), data.end());
    if (auto s = o.offer("in", mine); !s) return s;
    if (auto s = o.gather_reduce("in", mine, dtype, op, data); !s) return s;
    return o.finish();
  }
  // Reduce-scatter into a buffer of its own (this rank's chunk of `data` is still its input)...
  const size_t count = data.size() / esize;
  const auto mine = chunk_of(data, count, esize, rank_, n);
  std::vector<std::byte> reduced(mine.size());
  if (auto s = reduce_scatter_into(o, data, count, esize, dtype, op, reduced); !s) return s;
  // ...and before this rank rewrites its chunks, every rank must have fetched them.
  if (auto s = o.barrier("rsdone"); !s) return s;
  std::memcpy(mine.data(), reduced.data(), reduced.size());
  // Allgather of the reduced chunks, straight into place.
  if (!mine.empty()) {
    if (auto s = o.offer("ag", mine); !s) return s;
  }
  for (int q = 0; q < n; ++q) {
    if (auto chunk = chunk_of(data, count, esize, q, n); q != rank_ && !chunk.empty()) {
      o.take(q, "ag", chunk);
    }
  }
  if (auto s = o.wait_all(); !s) return s;
  return o.finish();
}

Status Group::reduce_scatter_into(Op& o, std::span<const std::byte> in, size_t count, size_t esize,
                                  DType dtype, ReduceOp op, std::span<std::byte> out) {
  const int n = size();
  // Rank q fetches chunk q of every other rank's input, offered as rs<q>.
  for (int q = 0; q < n; ++q) {
    if (auto chunk = chunk_of(in, count, esize, q, n); q != rank_ && !chunk.empty()) {
      if (auto s = o.offer("rs" + std::to_string(q), chunk); !s) return s;
    }
  }
  return o.gather_reduce("rs" + std::to_string(rank_), chunk_of(in, count, esize, rank_, n), dtype,
                         op, out);
}

Status Group::broadcast(std::span<std::byte> data, int root) {
  if (!failed_) return failed_;
  if (root < 0 || root >= size()) return {errc::invalid_argument, root, "broadcast: bad root"};
  Op o(*this, "broadcast");
  if (size() == 1) return {};
  if (rank_ == root) {
    if (auto s = o.offer("bc", data); !s) return s;
  } else {
    o.take(root, "bc", data);
    if (auto s = o.wait_all(); !s) return s;
  }
  return o.finish();
}

Status Group::allgather(std::span<const std::byte> in, std::span<std::byte> out) {
  if (!failed_) return failed_;
  const size_t n = static_cast<size_t>(size());
  if (out.size() != n * in.size()) {
    return {errc::invalid_argument, -1, "allgather: out must be size() * in.size() bytes"};
  }
  Op o(*this, "allgather");
  std::memcpy(out.data() + static_cast<size_t>(rank_) * in.size(), in.data(), in.size());
  if (n == 1) return {};
  if (auto s = o.offer("ag", in); !s) return s;
  for (int q = 0; q < size(); ++q) {
    if (q != rank_) o.take(q, "ag", out.subspan(static_cast<size_t>(q) * in.size(), in.size()));
  }
  if (auto s = o.wait_all(); !s) return s;
  return o.finish();
}

Status Group::reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType dtype,
                             ReduceOp op) {
  if (!failed_) return failed_;
  const size_t esize = dtype_size(dtype);
  if (esize == 0 || in.size() % esize) {
    return {errc::invalid_argument, -1, "reduce_scatter: size is not whole elements"};
  }
  const int n = size();
  const size_t count = in.size() / esize;
  if (out.size() != chunk_of(in, count, esize, rank_, n).size()) {
    return {errc::invalid_argument, -1, "reduce_scatter: out must be this rank's chunk"};
  }
  Op o(*this, "reduce_scatter");
  if (n == 1) {
    std::memcpy(out.data(), in.data(), in.size());
    return {};
  }
  if (auto s = reduce_scatter_into(o, in, count, esize, dtype, op, out); !s) return s;
  return o.finish();
}

}  // namespace ferry::collective
