#include "ferry/cma/cma_channel.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <cstring>
#include <new>
#include <utility>

#include "ferry/cma/process_memory.h"
#include "ferry/net/core/guard.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry::cma {

CmaChannel::CmaChannel(std::shared_ptr<PeerLink> link, pid_t peer_pid, Config config)
    : StrandGuarded(link->strand()),
      link_(link),
      peer_pid_(peer_pid),
      config_(std::move(config)),
      lease_timer_(strand_.get_inner_executor()) {}

void CmaChannel::send(uint64_t request_id, const wire::Message& m) {
  if (auto link = link_.lock()) {
    link->send_transport_message(kTransportName, request_id, m.SerializeAsString());
  }
}

void CmaChannel::send_release(uint64_t request_id, bool copied) {
  wire::Message m;
  m.set_release(copied);
  send(request_id, m);
}

void CmaChannel::complete(uint64_t request_id, std::error_code ec) {
  if (auto link = link_.lock()) link->complete_fetch(request_id, ec);
}

// ---------------------------------------------------------------- fetcher side

Result<FetchRequest> CmaChannel::fetch_multiple(const FetchOp& op) {
  waiting_.emplace(op.request_id, op);  // the owner's grant starts the copy
  return op.request;
}

void CmaChannel::on_grant(uint64_t request_id, const wire::Grant& grant) {
  auto w = waiting_.find(request_id);
  if (w == waiting_.end()) {  // aborted meanwhile: the owner lets its lease go, if it kept one
    if (grant.data_size() == 0 || grant.confirm()) send_release(request_id, false);
    return;
  }
  FetchOp op = std::move(w->second);
  waiting_.erase(w);
  // Either the bytes themselves or where they are, one entry per target, of its size.
  const bool with_bytes = grant.data_size() > 0;
  const auto n = static_cast<int>(op.targets.size());
  bool ok = grant.lengths_size() == n && grant.addrs_size() == (with_bytes ? 0 : n) &&
            grant.data_size() == (with_bytes ? n : 0) &&
            (with_bytes || (grant.lease() != 0 && grant.token() != 0));
  for (int i = 0; ok && i < n; ++i) {
    ok = grant.lengths(i) == op.targets[static_cast<size_t>(i)].size() &&
         (!with_bytes || grant.data(i).size() == grant.lengths(i));
  }
  if (!ok) {  // the grant does not describe the object the ref did
    FERRY_LOG_WARN("CMA: a grant for fetch {} does not match its targets", request_id);
    send_release(request_id, false);
    return complete(request_id, errc::protocol_error);
  }
  if (with_bytes) return take_bytes(request_id, op, grant);
  copying_.emplace(request_id, Copy{std::move(op),
                                    {grant.addrs().begin(), grant.addrs().end()},
                                    grant.lease(),
                                    grant.token()});
  copy_step(request_id);
}

void CmaChannel::take_bytes(uint64_t request_id, const FetchOp& op, const wire::Grant& grant) {
  for (size_t i = 0; i < op.targets.size(); ++i) {
    const auto& data = grant.data(static_cast<int>(i));
    if (data.empty()) continue;
    std::memcpy(op.targets[i].data(), data.data(), data.size());
    config_.counters->bytes += data.size();
    op.request.report_landed(data.size());
  }
  ++config_.counters->fetches;
  if (grant.confirm()) send_release(request_id, true);
  complete(request_id, {});
}

void CmaChannel::copy_step(uint64_t request_id) {
  auto it = copying_.find(request_id);
  if (it == copying_.end()) return;  // aborted meanwhile
  auto& c = it->second;
  size_t budget = config_.copy_step;
  std::error_code ec;
  while (!ec && c.tensor < c.op.targets.size() && budget > 0) {
    auto target = c.op.targets[c.tensor];
    const size_t n = std::min<size_t>(budget, target.size() - c.done);
    // Returns once every thread is done with the target: an abort after this step is immediate.
    ec = config_.copier->read(peer_pid_, target.data() + c.done, c.addrs[c.tensor] + c.done, n);
    if (!ec) {
      c.done += n;
      budget -= n;
      config_.counters->bytes += n;
      c.op.request.report_landed(n);
    }
    if (c.done == target.size()) {
      ++c.tensor;
      c.done = 0;
    }
  }
  if (ec) {
    // ESRCH: the owner is gone (its session ends too); EFAULT: the granted range is not mapped
    // there; EPERM: the kernel stopped letting us read it.
    FERRY_LOG_WARN("CMA: fetch {}: reading the owner's memory failed: {}", request_id,
                   ec.message());
    copying_.erase(it);
    send_release(request_id, false);
    return complete(request_id, ec.value() == ESRCH ? errc::peer_closed : errc::protocol_error);
  }
  if (c.tensor < c.op.targets.size()) {
    boost::asio::post(guarded(*this, [this, request_id] { copy_step(request_id); }));
    return;
  }
  const uint64_t lease = c.lease;
  const uint64_t token = c.token;
  copying_.erase(it);
  confirm(request_id, lease, token);
}

void CmaChannel::confirm(uint64_t request_id, uint64_t lease, uint64_t token) {
  // Every read of the copy (Copier::read returned: its helpers too) comes before this one: an
  // owner that changed the object after clearing the word cannot have changed what we copied and
  // still show the token here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t word = 0;
  const auto ec =
      read_process_memory(peer_pid_, reinterpret_cast<std::byte*>(&word), lease, sizeof word);
  if (ec) {
    FERRY_LOG_WARN("CMA: fetch {}: reading the owner's lease word failed: {}", request_id,
                   ec.message());
    send_release(request_id, false);
    return complete(request_id, ec.value() == ESRCH ? errc::peer_closed : errc::protocol_error);
  }
  const bool held = LeaseBoard::holds(word, token);
  send_release(request_id, held);
  if (held) ++config_.counters->fetches;
  // Not held: the owner let the object go while we copied (an abort, the lease timeout), so the
  // bytes are not the object's; the owner's own error for the request may come first.
  complete(request_id, held ? std::error_code() : std::error_code(errc::aborted));
}

// ---------------------------------------------------------------- owner side

void CmaChannel::send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) {
  wire::Message m;
  auto* grant = m.mutable_grant();
  const auto& tensors = object.object().tensors;
  // An object of no bytes goes by address: a grant with bytes needs an entry per tensor.
  const bool with_bytes =
      object.object().total_bytes() <= config_.inline_bytes && object.object().total_bytes() > 0;
  LeaseBoard::Slot slot;
  if (!with_bytes) {
    try {
      slot = config_.board->acquire();
    } catch (const std::bad_alloc&) {
      return done(errc::resource_exhausted);  // the session answers the fetcher with it
    }
    grant->set_lease(reinterpret_cast<uint64_t>(slot.word));
    grant->set_token(slot.token);
  }
  for (const auto& t : tensors) {
    grant->add_lengths(t.data.size());
    if (with_bytes) {
      grant->add_data(t.data.data(), t.data.size());
    } else {
      grant->add_addrs(reinterpret_cast<uint64_t>(t.data.data()));
    }
  }
  if (with_bytes && !object.object().on_served) {
    // The message holds the bytes: the object is not needed any more, and no release comes.
    send(request_id, m);
    return done({});
  }
  grant->set_confirm(with_bytes);  // (a grant by address is always released)
  // The session serves a request id once at a time: no lease of it is here.
  leases_.emplace(request_id, Lease{std::move(object), std::move(done), slot,
                                    std::chrono::steady_clock::now()});
  arm_lease_timer();
  send(request_id, m);
}

void CmaChannel::arm_lease_timer() {
  if (lease_timer_armed_ || leases_.empty()) return;
  auto oldest = std::chrono::steady_clock::time_point::max();
  for (const auto& [id, lease] : leases_) oldest = std::min(oldest, lease.granted);
  lease_timer_armed_ = true;
  lease_timer_.expires_at(oldest + config_.lease_timeout);
  lease_timer_.async_wait(on_expiry(*this, [this] {
    lease_timer_armed_ = false;
    expire_leases();
  }));
}

void CmaChannel::expire_leases() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint64_t> due;
  for (const auto& [id, lease] : leases_) {
    if (lease.granted + config_.lease_timeout <= now) due.push_back(id);
  }
  for (uint64_t id : due) {
    // Ending one lease tells the session, which may close this channel (and end the rest).
    if (closed_) return;
    if (auto it = leases_.find(id); it != leases_.end()) end_lease(it, errc::timed_out);
  }
  arm_lease_timer();
}

void CmaChannel::on_release(uint64_t request_id, bool copied) {
  auto it = leases_.find(request_id);
  if (it == leases_.end()) return;  // ended already (an abort, the lease timeout)
  end_lease(it, copied ? std::error_code() : std::error_code(errc::aborted));
}

void CmaChannel::end_lease(std::map<uint64_t, Lease>::iterator it, std::error_code ec) {
  config_.board->revoke(it->second.slot);  // before the object may go
  auto done = std::move(it->second.done);
  leases_.erase(it);  // unpins the object
  done(ec);
}

// ---------------------------------------------------------------- either side

bool CmaChannel::on_message(uint64_t request_id, std::string_view payload) {
  wire::Message m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    if (auto link = link_.lock()) link->fail(errc::protocol_error);
    return true;
  }
  switch (m.body_case()) {
    case wire::Message::kGrant:
      on_grant(request_id, m.grant());
      return true;
    case wire::Message::kRelease:
      on_release(request_id, m.release());
      return true;
    default:
      return false;  // channel set-up: the transport's
  }
}

void CmaChannel::out_of_memory() { fail_peer(link_, *this, errc::resource_exhausted); }

bool CmaChannel::abort(uint64_t request_id) {
  waiting_.erase(request_id);  // a grant that still comes is released unread
  if (copying_.erase(request_id) > 0) {
    // Copies run in steps on this strand, so none is running now: stopping is immediate.
    send_release(request_id, false);
  }
  if (auto l = leases_.find(request_id); l != leases_.end()) end_lease(l, errc::aborted);
  return true;  // nothing of ours touches the request's buffers any more
}

void CmaChannel::close(std::error_code ec) {
  if (closed_) return;
  closed_ = true;
  lease_timer_.cancel();
  waiting_.clear();  // the session completes the fetches
  copying_.clear();
  auto ending = std::move(leases_);
  leases_.clear();
  for (auto& [id, lease] : ending) {
    config_.board->revoke(lease.slot);
    lease.done(ec);
  }
}

}  // namespace ferry::cma
