#include "ferry/net/session/fetch_table.h"

#include <algorithm>

#include "ferry/net/core/deadline.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/system/system_memory.h"
#include "ferry/store/checksum.h"

namespace ferry {

std::shared_ptr<std::byte[]> FetchTable::allocate_slots(
    mem::Pool& pool, const std::vector<size_t>& sizes, std::vector<MutableBuffer>& slots) noexcept {
  try {
    const uint64_t limit = physical_memory_bytes();
    uint64_t total = 0;
    std::vector<size_t> offsets;
    offsets.reserve(sizes.size());
    for (size_t n : sizes) {
      if (n > limit || total > limit - n) return nullptr;  // also keeps the sum from wrapping
      offsets.push_back(total);
      total += (n + 63) & ~size_t{63};
    }
    auto memory = pool.allocate(total);
    if (!memory) return nullptr;
    slots.clear();
    slots.reserve(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      slots.emplace_back(memory.get() + offsets[i], sizes[i]);
    }
    return memory;
  } catch (const std::bad_alloc&) {  // the bookkeeping itself
    return nullptr;
  }
}

std::shared_ptr<std::byte[]> FetchTable::allocate_slots(
    mem::Pool& pool, const ObjectRef& ref, std::vector<MutableBuffer>& slots) noexcept {
  try {
    std::vector<size_t> sizes;
    sizes.reserve(ref.metadata.tensors.size());
    for (const auto& t : ref.metadata.tensors) sizes.push_back(t.nbytes);
    return allocate_slots(pool, sizes, slots);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

FetchTable::FetchTable(SessionLink& link, mem::Pool& pool) : link_(link), pool_(pool) {}

void FetchTable::start(std::shared_ptr<detail::FetchState> state, ObjectRef ref,
                       std::vector<MutableBuffer> targets, std::shared_ptr<std::byte[]> storage,
                       FetchOptions options) {
  auto& result = state->result();
  const std::string& peer_name = link_.peer().info().name;
  std::error_code ec;
  const auto& md = ref.metadata;
  std::shared_ptr<TransportManager> transport;
  if (md.exclusive && !options.transport.empty() && options.transport != "auto" &&
      options.transport != md.transport) {
    ec = errc::transport_unavailable;  // the caller insists on another transport
  } else if (md.exclusive) {
    transport = link_.pick_transport(md.transport, {}, ec);
    if (!transport) ec = errc::transport_unavailable;  // unknown here is unavailable to both
  } else {
    transport = link_.pick_transport(options.transport, md.transport, ec);
  }
  if (!transport) {
    if (md.exclusive) {
      FERRY_LOG_WARN(
          "fetch from '{}': object {} is offered only over {}, which this side and "
          "the peer do not share",
          peer_name, ref.object_id, md.transport);
    } else {
      FERRY_LOG_WARN("fetch from '{}': transport '{}': {}", peer_name, options.transport,
                     ec.message());
    }
    state->complete(ec);
    return;
  }
  const auto& tensors = ref.metadata.tensors;
  if (storage) {
    result.storage = std::move(storage);  // `targets` are its slots
  } else if (targets.empty()) {
    result.storage = allocate_slots(pool_, ref, targets);
    if (!result.storage) {
      FERRY_LOG_WARN(
          "fetch from '{}': object {} announces {} bytes, more than this process can "
          "allocate",
          peer_name, ref.object_id, ref.metadata.total_bytes());
      state->complete(errc::resource_exhausted);
      return;
    }
  } else {
    bool ok = targets.size() == tensors.size();
    for (size_t i = 0; ok && i < tensors.size(); ++i) ok = targets[i].size() == tensors[i].nbytes;
    if (!ok) {
      state->complete(errc::size_mismatch);
      return;
    }
  }
  result.ref = std::move(ref);
  result.tensors = targets;
  result.transport = transport->name();
  result.bytes = result.ref.metadata.total_bytes();
  const bool forced = !options.transport.empty() && options.transport != "auto";
  if (options.timeout.count() > 0) {
    options.timeout = bounded_timeout(options.timeout);
    const auto now = link_.now();
    waiting_[state->id()] = Waiting{state, now, now + options.timeout};
    link_.arm_deadline(now + options.timeout);
  }
  link_.ensure_channel(transport, [this, state, transport, forced, targets = std::move(targets),
                                   options = std::move(options)](std::error_code ec) mutable {
    if (!ec) {
      start_transfer(std::move(state), std::move(transport), std::move(targets),
                     std::move(options));
      return;
    }
    // The transport's channel cannot be (re)built: unless the caller insisted on it, fall back
    // to the next transport both sides have, and say so.
    std::shared_ptr<TransportManager> fallback;
    if (!forced && link_.is_open()) fallback = link_.fallback_transport(*transport);
    if (!fallback) {
      state->complete(ec);
      return;
    }
    FERRY_LOG_WARN("peer '{}': no {} channel ({}); this fetch falls back to {}",
                   link_.peer().info().name, transport->name(), ec.message(), fallback->name());
    state->result().transport = fallback->name();
    link_.ensure_channel(fallback, [this, state, fallback, targets = std::move(targets),
                                    options = std::move(options)](std::error_code ec) mutable {
      if (ec) {
        state->complete(ec);
        return;
      }
      start_transfer(std::move(state), std::move(fallback), std::move(targets), std::move(options));
    });
  });
}

void FetchTable::start_transfer(std::shared_ptr<detail::FetchState> state,
                                std::shared_ptr<TransportManager> transport,
                                std::vector<MutableBuffer> targets, FetchOptions options) {
  PendingFetch pending{state, transport, link_.now()};
  if (auto w = waiting_.find(state->id()); w != waiting_.end()) {
    pending.started = w->second.started;
    pending.deadline = w->second.deadline;
    waiting_.erase(w);
  }
  if (state->done()) return;  // aborted or timed out while the channel was opening
  if (!link_.is_open()) {
    const auto reason = link_.close_reason();
    state->complete(reason ? reason : std::error_code(errc::peer_closed));
    return;
  }
  // Out of memory from here to launch(), which guards its own: this step runs from the channel's
  // opening, where nothing else holds the fetch (a deadline's entry went above), so it ends here.
  try {
    prepare_transfer(state, std::move(transport), std::move(targets), std::move(options),
                     std::move(pending));
  } catch (const std::bad_alloc&) {
    state->complete(errc::resource_exhausted);
  }
}

void FetchTable::prepare_transfer(const std::shared_ptr<detail::FetchState>& state,
                                  std::shared_ptr<TransportManager> transport,
                                  std::vector<MutableBuffer> targets, FetchOptions options,
                                  PendingFetch pending) {
  const auto& metas = state->result().ref.metadata.tensors;
  pending.verify = options.verify && std::any_of(metas.begin(), metas.end(),
                                                 [](const auto& t) { return t.checksum; });
  CombineFn stream;
  if (options.combine && transport->combines()) {
    stream = std::move(options.combine);
    pending.streams = true;
    if (pending.verify) {
      // Each piece is summed on its way into the combine: in order within a target, every byte
      // once (CombineFn's contract), so the sums are the CRC-32C of each target's bytes.
      pending.streamed = std::make_shared<std::vector<uint32_t>>(targets.size(), 0);
      stream = [inner = std::move(stream), sums = pending.streamed, targets](
                   std::span<std::byte> piece, std::span<const std::byte> arrived) {
        const auto at = reinterpret_cast<uintptr_t>(piece.data());
        for (size_t i = 0; i < targets.size(); ++i) {
          const auto begin = reinterpret_cast<uintptr_t>(targets[i].data());
          if (at >= begin && at < begin + targets[i].size()) {
            (*sums)[i] = crc32c(arrived, (*sums)[i]);
            break;
          }
        }
        inner(piece, arrived);
      };
    }
  } else if (options.combine) {
    // The transport lands the bytes whole: in slots of ours, combined on success.
    std::vector<size_t> sizes;
    for (const auto& t : targets) sizes.push_back(t.size());
    pending.combine = std::move(options.combine);
    pending.targets = std::move(targets);
    pending.landed = allocate_slots(pool_, sizes, targets);
    if (!pending.landed) {
      state->complete(errc::resource_exhausted);
      return;
    }
    pending.slots = targets;
  }
  launch(state->id(), std::move(pending), std::move(targets), std::move(stream));
}

void FetchTable::launch(uint64_t id, PendingFetch pending, std::vector<MutableBuffer> targets,
                        CombineFn stream) {
  const auto state = pending.state;
  const auto transport = pending.transport;
  const auto deadline = pending.deadline;
  const auto& ref = state->result().ref;
  if (deadline != Clock::time_point::max()) link_.arm_deadline(deadline);
  try {
    FetchOp op{
        id, ref, std::move(targets), FetchRequest(state), std::move(stream), pending.resume_at};
    fetches_.emplace(id, std::move(pending));
    // The channel is gone again if it broke since ensure_channel (then nothing was started).
    const auto channel = link_.peer().channel(transport->name());
    Result<FetchRequest> started = make_error_code(errc::transport_unavailable);
    if (channel) {
      started =
          transport->is_one_sided() ? channel->fetch_multiple(op) : channel->recv_multiple(op);
    }
    if (!started) {
      complete(id, started.error());
      return;
    }
    request(id, *transport, ref, deadline);
  } catch (const std::bad_alloc&) {
    // Out of memory before the peer was asked: the fetch ends here, once (the transport lets go
    // of what it started first).
    if (fetches_.count(id)) {
      complete(id, errc::resource_exhausted);
    } else {
      state->complete(errc::resource_exhausted);
    }
  }
}

void FetchTable::request(uint64_t id, const TransportManager& transport, const ObjectRef& ref,
                         Clock::time_point deadline) {
  wire::Envelope env;
  env.set_request_id(id);
  auto* f = env.mutable_fetch();
  f->set_object_id(ref.object_id);
  f->set_transport(transport.name());
  f->set_owner_instance(ref.owner_instance);
  for (const auto& t : ref.metadata.tensors) f->add_sizes(t.nbytes);
  if (!ref.name.empty()) {
    f->set_name(ref.name);
    // The owner waits for the name at most the time left to the deadline (and at most its lease
    // timeout); the clock is read only when there is a deadline.
    uint64_t wait_ms = ~uint64_t{0};
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - link_.now());
      wait_ms = static_cast<uint64_t>(std::max<int64_t>(left.count(), 1));
    }
    f->set_wait_ms(wait_ms);
  }
  FERRY_LOG_DEBUG("peer '{}': fetch {} of object {} '{}' requested over {}",
                  link_.peer().info().name, id, ref.object_id, ref.name, transport.name());
  link_.send(env);
}

void FetchTable::fail(detail::FetchState& state, std::error_code ec) {
  if (const uint64_t wire = wire_id(state.id()); fetches_.count(wire)) {
    complete(wire, ec);  // launched: the transport lets go of the targets first
  } else {
    state.complete(ec);
  }
}

void FetchTable::abort(uint64_t id, const std::weak_ptr<detail::FetchState>& state) {
  if (const uint64_t wire = wire_id(id); fetches_.count(wire)) {
    complete(wire, errc::aborted);
  } else if (auto s = state.lock()) {
    s->complete(errc::aborted);  // not started yet (channel opening): nothing to undo
  }
}

uint64_t FetchTable::wire_id(uint64_t id) const {
  auto it = restarted_.find(id);
  return it == restarted_.end() ? id : it->second;
}

void FetchTable::restart(uint64_t request_id, std::error_code ec, uint64_t landed) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return;
  auto& p = it->second;
  auto& restarts = p.state->result().restarts;
  // A name may stand for another object by the next attempt: such a fetch reads it all again.
  if (!p.state->result().ref.name.empty()) landed = 0;
  const bool progress = landed > p.resume_at;
  if (p.releasing || p.streams || (!progress && p.fruitless >= kMaxFetchRestarts) ||
      !link_.is_open() || link_.now() >= p.deadline) {
    return complete(request_id, ec);
  }
  // The transport has let go of the targets: the fetch waits for a new channel, outside fetches_
  // (an abort completes it at once; its deadline goes on running in waiting_).
  ++restarts;
  if (progress) {
    p.resume_at = landed;
    p.fruitless = 0;
  } else {
    ++p.fruitless;
  }
  auto pending = std::move(p);
  fetches_.erase(it);
  const uint64_t original = pending.state->id();
  // Also without a deadline: should its channel's open never call back (an open that threw),
  // the session's end completes it from here.
  waiting_[original] = Waiting{pending.state, pending.started, pending.deadline};
  const uint64_t id = link_.next_request_id();
  restarted_[original] = id;
  FERRY_LOG_INFO(
      "peer '{}': fetch {} lost its {} channel ({}): fetching it again as request {} from byte "
      "{} (restart {}, {} of {} in a row without progress)",
      link_.peer().info().name, original, pending.transport->name(), ec.message(), id,
      pending.resume_at, restarts, pending.fruitless, kMaxFetchRestarts);
  // Posted: the transport drops the broken channel after this call, and the restart must not
  // find it still installed.
  link_.post([this, id, ec, pending = std::move(pending)]() mutable {
    if (!link_.is_open()) return relaunch(id, std::move(pending), ec, {});
    auto transport = pending.transport;
    link_.ensure_channel(
        transport, [this, id, ec, pending = std::move(pending)](std::error_code open_ec) mutable {
          relaunch(id, std::move(pending), ec, open_ec);
        });
  });
}

void FetchTable::relaunch(uint64_t id, PendingFetch pending, std::error_code ec,
                          std::error_code open_ec) {
  auto state = pending.state;
  waiting_.erase(state->id());
  std::error_code failed;
  if (!link_.is_open()) {
    const auto reason = link_.close_reason();
    failed = reason ? reason : ec;  // the session ended: its reason
  } else if (open_ec) {
    failed = ec;  // no new channel: the broken channel's error
  }
  if (state->done() || failed) {
    restarted_.erase(state->id());
    if (state->done()) return;  // aborted meanwhile
    FERRY_LOG_WARN("peer '{}': fetch {} cannot start again: {}", link_.peer().info().name,
                   state->id(), (open_ec ? open_ec : failed).message());
    state->result().elapsed = link_.now() - pending.started;
    state->complete(failed);
    return;
  }
  auto targets = pending.combine ? pending.slots : state->result().tensors;
  state->set_landed(pending.resume_at);  // what follows lands again
  launch(id, std::move(pending), std::move(targets), {});
}

void FetchTable::complete(uint64_t request_id, std::error_code ec) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return;
  if (it->second.releasing) {
    // The transport has drained what it had posted for an aborted fetch: report the abort now.
    ec = it->second.releasing;
  } else if (ec) {
    // The transport lets go of the targets before the caller hears of the failure.
    const auto channel = link_.peer().channel(it->second.transport->name());
    if (channel && !channel->abort(request_id)) {
      it->second.releasing = ec;  // it calls complete() again once they are free
      it->second.deadline = Clock::time_point::max();
      return;
    }
  }
  // Only now may the owner stop: a one-sided grant revoked while our READs are still posted
  // fails them with a remote access error and breaks the queue pair under every other fetch on
  // it.
  if ((ec == errc::aborted || ec == errc::timed_out) && link_.is_open()) {
    wire::Envelope env;
    env.set_request_id(request_id);
    env.mutable_cancel();
    link_.send(env);
  }
  FERRY_LOG_DEBUG("peer '{}': fetch {} completes: {}", link_.peer().info().name, request_id,
                  ec ? ec.message() : "ok");
  auto pending = std::move(it->second);
  fetches_.erase(it);
  if (!restarted_.empty()) restarted_.erase(pending.state->id());
  if (!ec && pending.verify) ec = verify(pending);
  if (!ec && pending.combine) {
    for (size_t i = 0; i < pending.targets.size(); ++i) {
      if (!pending.targets[i].empty()) pending.combine(pending.targets[i], pending.slots[i]);
    }
  }
  // Everything else of the fetch goes before its waiter wakes, and this thread's reference to
  // its state right after: a result dropped as soon as the wait returns comes back to the pool
  // without waiting longer than complete() takes.
  auto state = std::move(pending.state);
  state->result().elapsed = link_.now() - pending.started;
  pending = PendingFetch{};
  state->complete(ec);
  state.reset();
  link_.fetch_completed();
}

std::error_code FetchTable::verify(const PendingFetch& f) const {
  const auto& result = f.state->result();
  const auto& metas = result.ref.metadata.tensors;
  const auto& landed = f.combine ? f.slots : result.tensors;
  for (size_t i = 0; i < metas.size() && i < landed.size(); ++i) {
    if (!metas[i].checksum) continue;
    const uint32_t got = f.streamed ? (*f.streamed)[i] : crc32c(landed[i]);
    if (got == *metas[i].checksum) continue;
    FERRY_LOG_WARN(
        "peer '{}': fetch {} of object {} over {}: tensor {} ({} bytes) landed with CRC-32C "
        "{:08x}, its owner put it with {:08x}",
        link_.peer().info().name, f.state->id(), result.ref.object_id, f.transport->name(), i,
        landed[i].size(), got, *metas[i].checksum);
    return errc::data_corrupted;
  }
  return {};
}

bool FetchTable::awaits_peer_bytes() const {
  return std::any_of(fetches_.begin(), fetches_.end(), [this](const auto& f) {
    return !f.second.transport->is_one_sided() && link_.peer().channel(f.second.transport->name());
  });
}

void FetchTable::expire(Clock::time_point now) {
  std::vector<uint64_t> due;
  for (const auto& [id, f] : fetches_) {
    if (f.deadline <= now) due.push_back(id);
  }
  for (uint64_t id : due) complete(id, errc::timed_out);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    // Nothing of it was started: no transport or peer to tell.
    if (auto state = it->second.state.lock(); state && !state->done()) {
      state->result().elapsed = now - it->second.started;
      state->complete(errc::timed_out);
    }
    it = waiting_.erase(it);
  }
}

FetchTable::Clock::time_point FetchTable::next_deadline() const {
  auto next = Clock::time_point::max();
  for (const auto& [id, f] : fetches_) next = std::min(next, f.deadline);
  for (const auto& [id, w] : waiting_) next = std::min(next, w.deadline);
  return next;
}

void FetchTable::close(std::error_code reason) {
  // Their channels' ends complete them too (the first completion wins): not every such end runs
  // (an open that threw took its waiter with it), and nothing of theirs is on a transport.
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& [id, w] : waiting) {
    if (auto state = w.state.lock()) state->complete(reason);
  }
  auto fetches = std::move(fetches_);
  fetches_.clear();
  for (auto& [id, pending] : fetches) {
    pending.state->result().elapsed = link_.now() - pending.started;
    pending.state->complete(reason);
  }
}

}  // namespace ferry
