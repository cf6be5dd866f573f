#include "ferry/rdma/rdma_channel.h"

#include <fcntl.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <cstring>
#include <random>
#include <utility>

#include "ferry/net/core/guard.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/rdma/post_back.h"

namespace ferry::rdma {
namespace asio = boost::asio;

namespace {

constexpr uint64_t kReadChunk = 1u << 20;  // bytes per READ work request
// READs one fetch may have posted at once. Bounds what an abort must wait for (posted READs
// cannot be recalled).
constexpr uint32_t kWindow = 8;
// Bytes of READs the queue pair may have posted at once, over all its fetches (post_reads fills
// it oldest first): 8 MiB in flight is well above the bandwidth-delay product of any RDMA link.
constexpr uint64_t kPipeBytes = 8u << 20;
constexpr unsigned kAckBatch = 64;  // CQ events acknowledged at once
constexpr int kPollBatch = 32;
constexpr auto kSafetyNet = std::chrono::seconds(1);
// Work requests that bind memory windows carry the lease's request id with this bit set, apart
// from the READs (which carry the fetch's request id; ids never reach it).
constexpr uint64_t kBindBit = 1ull << 63;
// The probe READ's work request id (post_probe); fetch ids never reach it either.
constexpr uint64_t kProbeId = 1ull << 62;
// Safety-net ticks without a completion, READs outstanding, before a probe is posted: a
// retransmission takes 0.5 s a try with our timeout, so two seconds are rarely a loss alone.
constexpr unsigned kProbeAfterTicks = 2;

// One extent of a grant's segment that a single rkey opens: the segment itself, or one of its
// pieces (wire::Segment.pieces).
struct Extent {
  uint64_t addr;
  uint64_t length;
  uint32_t rkey;
  int piece;  // -1: the segment's own rkey
};

// Whether `seg`'s pieces, if it has any, are all non-empty and add up to its length (else the
// grant is malformed).
bool pieces_cover(const wire::Segment& seg) {
  uint64_t left = seg.length();
  for (const auto& p : seg.pieces()) {
    if (p.length() == 0 || p.length() > left) return false;
    left -= p.length();
  }
  return seg.pieces_size() == 0 || left == 0;
}

// Calls `fn(Extent)` for each extent of `seg` in address order (pieces_cover(seg) holds).
template <typename Fn>
void for_each_extent(const wire::Segment& seg, Fn&& fn) {
  if (seg.pieces_size() == 0) {
    if (seg.length() > 0) fn(Extent{seg.addr(), seg.length(), seg.rkey(), -1});
    return;
  }
  uint64_t at = seg.addr();
  for (int i = 0; i < seg.pieces_size(); ++i) {
    fn(Extent{at, seg.pieces(i).length(), seg.pieces(i).rkey(), i});
    at += seg.pieces(i).length();
  }
}

// Adds to `seg` the extent of `length` bytes that `rkey` opens, next after those it has: its own
// rkey when that extent is the whole segment, else a piece.
void add_extent(wire::Segment& seg, uint64_t length, uint32_t rkey) {
  if (length == seg.length()) return seg.set_rkey(rkey);
  auto* piece = seg.add_pieces();
  piece->set_length(length);
  piece->set_rkey(rkey);
}

// Sets `seg`'s rkey from `region`, or its pieces, one per registration of `region` it spans.
void describe(wire::Segment& seg, const Region& region) {
  const uintptr_t end = seg.addr() + seg.length();
  for (uintptr_t at = seg.addr(); at < end;) {
    const uintptr_t next = std::min(region.chunk_end(at), end);
    add_extent(seg, next - at, region.rkey_at(at));
    at = next;
  }
}

// Sets the rkey of `seg`'s extent `piece` (-1: the segment's own).
void set_extent_rkey(wire::Segment& seg, int piece, uint32_t rkey) {
  if (piece < 0) return seg.set_rkey(rkey);
  seg.mutable_pieces(piece)->set_rkey(rkey);
}

// The grant of `object` for a lease of `lease`: one segment per tensor, with the rkeys of
// `regions` (per tensor; null entries, or none at all, leave a segment's rkeys to be set).
wire::Grant make_grant(const StoredObject& object,
                       const std::vector<std::shared_ptr<Region>>& regions,
                       std::chrono::milliseconds lease) {
  wire::Grant g;
  g.set_lease_ms(static_cast<uint64_t>(lease.count()));
  for (size_t i = 0; i < object.tensors.size(); ++i) {
    auto* seg = g.add_segments();
    seg->set_addr(reinterpret_cast<uint64_t>(object.tensors[i].data.data()));
    seg->set_length(object.tensors[i].data.size());
    if (i < regions.size() && regions[i]) describe(*seg, *regions[i]);
  }
  return g;
}

// Registers each segment of `grant` in `pd`, in pieces of at most the device's largest
// registration, into `out`, and puts the rkeys in the grant; false (logged) if one fails. The
// registrar's thread.
bool register_segments(Device& device, ibv_pd* pd, wire::Grant& grant,
                       std::vector<GrantMrHandle>& out) {
  const uint64_t most = device.max_registration();
  for (auto& seg : *grant.mutable_segments()) {
    for (uint64_t off = 0, length = 0; off < seg.length(); off += length) {
      length = std::min(most, seg.length() - off);
      auto mr = device.register_grant(pd, reinterpret_cast<const void*>(seg.addr() + off),
                                      static_cast<size_t>(length));
      if (!mr) return false;
      add_extent(seg, length, (*mr)->rkey);
      out.push_back(std::move(*mr));
    }
  }
  return true;
}

}  // namespace

RdmaChannel::RdmaChannel(std::shared_ptr<Device> device, Address address,
                         std::shared_ptr<PeerLink> link, ChannelOptions options)
    : device_(std::move(device)),
      address_(address),
      link_(link),
      strand_(link->strand()),
      options_(options),
      cq_fd_(strand_.get_inner_executor()),
      safety_timer_(strand_.get_inner_executor()) {}

RdmaChannel::~RdmaChannel() {
  // Order matters: grant registrations and windows before the QP and its PD, the QP before its
  // CQ and PD, every CQ event acked before the CQ goes, and the completion channel's fd is the
  // channel's to close, not Asio's.
  leases_.clear();
  retired_.clear();
  qp_.reset();
  if (quiet_) retire(std::move(quiet_));  // the reaper runs it once the QP is destroyed
  if (probe_mr_) {
    // After the QP is destroyed (the reaper's order): a probe in flight may write its byte
    // until then.
    auto probe = std::make_shared<std::pair<MrHandle, std::unique_ptr<std::byte[]>>>(
        std::move(probe_mr_), std::move(probe_byte_));
    retire([probe] {});
  }
  if (cq_ && unacked_events_) ibv_ack_cq_events(cq_.get(), unacked_events_);
  cq_.reset();
  if (cq_fd_.is_open()) cq_fd_.release();
  comp_channel_.reset();
  own_pd_.reset();
}

std::error_code RdmaChannel::init(bool serves) {
  ibv_context* ctx = device_->context();
  pd_ = device_->pd();
  if (serves && device_->grants() == RdmaGrants::registrations) {
    own_pd_ = device_->alloc_pd();
    if (!own_pd_) return last_errno();
    pd_ = own_pd_.get();
  }
  const auto& attr = device_->attr();
  sq_depth_ = static_cast<uint32_t>(std::min(256, attr.max_qp_wr));
  max_rd_ = static_cast<uint32_t>(std::clamp(attr.max_qp_rd_atom, 1, 16));
  comp_channel_.reset(ibv_create_comp_channel(ctx));
  if (!comp_channel_) return last_errno();
  const int flags = fcntl(comp_channel_->fd, F_GETFL);
  if (fcntl(comp_channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) return last_errno();
  cq_.reset(ibv_create_cq(ctx, static_cast<int>(sq_depth_ + 8), this, comp_channel_.get(), 0));
  if (!cq_) return last_errno();
  ibv_qp_init_attr init{};
  init.send_cq = cq_.get();
  init.recv_cq = cq_.get();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = sq_depth_;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  qp_ = device_->create_qp(pd_, init);
  if (!qp_) return last_errno();
  if (!serves) {
    probe_byte_ = std::make_unique<std::byte[]>(64);
    probe_mr_.reset(ibv_reg_mr(pd_, probe_byte_.get(), 64, IBV_ACCESS_LOCAL_WRITE));
    if (!probe_mr_) return last_errno();
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = address_.port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp_.get(), &a,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return last_errno();
  }
  psn_ = std::random_device{}() & 0xffffff;
  boost::system::error_code ec;
  cq_fd_.assign(comp_channel_->fd, ec);
  return ec;
}

wire::QpInfo RdmaChannel::local_info() const {
  wire::QpInfo info;
  info.set_qpn(qp_->qp_num);
  info.set_psn(psn_);
  info.set_gid(std::string(reinterpret_cast<const char*>(address_.gid.raw), 16));
  info.set_mtu(address_.mtu);
  info.set_max_rd(max_rd_);
  return info;
}

std::error_code RdmaChannel::connect(const wire::QpInfo& remote) {
  if (remote.gid().size() != 16) return make_error_code(errc::protocol_error);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(address_.mtu, remote.mtu()));
  a.dest_qp_num = remote.qpn();
  a.rq_psn = remote.psn() & 0xffffff;
  a.max_dest_rd_atomic = static_cast<uint8_t>(max_rd_);
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid().data(), 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(address_.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = address_.port;
  if (ibv_modify_qp(qp_.get(), &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    return last_errno();
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 17;  // ~0.5 s per try: software RDMA under emulation can be that slow
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = psn_;
  a.max_rd_atomic = static_cast<uint8_t>(std::clamp<uint32_t>(
      std::min<uint32_t>(remote.max_rd(), device_->attr().max_qp_init_rd_atom), 1, 16));
  if (ibv_modify_qp(qp_.get(), &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    return last_errno();
  }
  connected_ = true;
  if (ibv_req_notify_cq(cq_.get(), 0) != 0) return last_errno();
  watch();
  return {};
}

// ---------------------------------------------------------------- completions

void RdmaChannel::watch() {
  if (closed_ || options_.busy_poll) return;
  cq_fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                    guarded(*this, [this](boost::system::error_code ec) {
                      if (!ec) on_cq_event();
                    }));
}

void RdmaChannel::on_cq_event() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(comp_channel_.get(), &cq, &context) == 0) ++unacked_events_;
  if (unacked_events_ >= kAckBatch) {
    ibv_ack_cq_events(cq_.get(), unacked_events_);
    unacked_events_ = 0;
  }
  // Re-arm before draining: a completion that lands after the drain raises a new event.
  ibv_req_notify_cq(cq_.get(), 0);
  drain();
  watch();
}

void RdmaChannel::drain() {
  ibv_wc wcs[kPollBatch];
  int n;
  while (!closed_ && (n = ibv_poll_cq(cq_.get(), kPollBatch, wcs)) > 0) {
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (!(wc.wr_id & kBindBit) && wc.wr_id != kProbeId && wc.status == IBV_WC_SUCCESS &&
          lose_completion()) {
        continue;  // as if the device never wrote it
      }
      ++completions_;
      if (in_flight_) --in_flight_;
      if (wc.wr_id == kProbeId) {
        if (!on_probe(wc)) return;  // it failed the pair
        continue;
      }
      if (wc.wr_id & kBindBit) {
        if (wc.status != IBV_WC_SUCCESS) {
          if (wc.status != IBV_WC_WR_FLUSH_ERR) {
            FERRY_LOG_WARN("rdma: binding a memory window for request {} failed: {}",
                           wc.wr_id & ~kBindBit, ibv_wc_status_str(wc.status));
          }
          fail(make_wc_error(wc.status));
          return;
        }
        on_bound(wc.wr_id & ~kBindBit);
        continue;
      }
      ++reads_done_;
      auto it = fetches_.find(wc.wr_id);
      if (it != fetches_.end() && it->second.posted) {
        --it->second.posted;
        const uint32_t length = it->second.posted_lengths.front();
        it->second.posted_lengths.pop_front();
        posted_bytes_ -= length;
        if (wc.status == IBV_WC_SUCCESS) {
          it->second.landed += length;
          it->second.op.request.report_landed(length);
        }
      }
      if (wc.status != IBV_WC_SUCCESS) {
        if (wc.status != IBV_WC_WR_FLUSH_ERR) {
          FERRY_LOG_WARN("rdma: READ for request {} failed: {}", wc.wr_id,
                         ibv_wc_status_str(wc.status));
          // A READ the owner refused (access, protection, invalid request) fails its own fetch;
          // the others of the queue pair are flushed with it and start again (fail()). A path
          // that gave up (retries exhausted) says nothing against this fetch: it starts again too.
          const bool path =
              wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR;
          if (it != fetches_.end() && !path) it->second.error = make_wc_error(wc.status);
        }
        fail(make_wc_error(wc.status));
        return;
      }
      if (it != fetches_.end()) maybe_finish(wc.wr_id);
    }
  }
  post_binds();
  post_reads();
}

void RdmaChannel::busy_loop() {
  drain();
  if (closed_ || in_flight_ == 0) {
    busy_running_ = false;
    return;
  }
  asio::post(guarded(*this, [this] { busy_loop(); }));
}

void RdmaChannel::watch_posted() {
  arm_safety_net();
  if (options_.busy_poll && !busy_running_) {
    busy_running_ = true;
    asio::post(guarded(*this, [this] { busy_loop(); }));
  }
}

void RdmaChannel::arm_safety_net() {
  if (safety_armed_ || closed_) return;
  safety_armed_ = true;
  safety_timer_.expires_after(kSafetyNet);
  safety_timer_.async_wait(on_expiry(*this, [this] {
    safety_armed_ = false;
    const uint64_t before = completions_;
    drain();
    // Ticks in a row with work requests outstanding and not one completion.
    idle_ticks_ = in_flight_ == 0 || completions_ != before ? 0 : idle_ticks_ + 1;
    if (in_flight_ == 0) return;
    // Past the stall timeout give up on the queue pair: in the error state it flushes and
    // places no more data, so its fetches fail now instead of never (seen on rxe: READs
    // through memory windows of one registration, many in flight, neither completing nor
    // failing). Before that, say what it looks like every 5 s from 2 s on (a device that
    // stopped completing is otherwise invisible; a gap of a second is a retransmission, which
    // takes 0.5 s a try with our timeout and is common on rxe).
    if (idle_ticks_ * kSafetyNet >= options_.stall_timeout) {
      FERRY_LOG_WARN(
          "rdma: queue pair {}: no completion for {} s with {} work requests outstanding: "
          "treating it as broken",
          qp_->qp_num, idle_ticks_, in_flight_);
      return fail(make_error_code(errc::peer_unresponsive));
    }
    if (idle_ticks_ == kProbeAfterTicks) post_probe();
    if (idle_ticks_ % 5 == 2) {
      ibv_qp_attr a{};
      ibv_qp_init_attr init{};
      ibv_query_qp(qp_.get(), &a, IBV_QP_STATE, &init);
      FERRY_LOG_WARN(
          "rdma: queue pair {} (state {}): {} work requests outstanding, no completion for "
          "{} s ({} fetches, {} leases, {} leases binding)",
          qp_->qp_num, static_cast<int>(a.qp_state), in_flight_, idle_ticks_, fetches_.size(),
          leases_.size(), binds_waiting_.size());
    }
    arm_safety_net();
  }));
}

bool RdmaChannel::lose_completion() {
  if (lose_after_ == Hooks::kNever && options_.hooks) {
    uint32_t after = options_.hooks->lose_after.load(std::memory_order_acquire);
    if (after != Hooks::kNever &&
        options_.hooks->lose_after.compare_exchange_strong(after, Hooks::kNever)) {
      lose_after_ = after;
    }
  }
  if (lose_after_ == Hooks::kNever) return false;
  if (lose_after_ == 0) return true;
  --lose_after_;
  return false;
}

// ---------------------------------------------------------------- fetcher side

Result<FetchRequest> RdmaChannel::fetch_multiple(const FetchOp& op) {
  Fetch f;
  f.regions.reserve(op.targets.size());
  uint64_t missing = 0;  // bytes of targets that miss the cache
  for (const auto& t : op.targets) {
    f.regions.push_back(t.empty() ? nullptr : device_->local_cache().find(t.data(), t.size()));
    if (!t.empty() && !f.regions.back()) missing += t.size();
  }
  // Small ones are registered here, unless memory around them is being registered now (the
  // receive pool's new region): acquire() would wait for that.
  bool underway = false;
  for (size_t i = 0; i < op.targets.size() && missing > 0; ++i) {
    const auto& t = op.targets[i];
    underway = underway || (!t.empty() && !f.regions[i] &&
                            device_->local_cache().being_registered(t.data(), t.size()));
  }
  if (missing > 0 && missing < kRegisterOnTheStrandBelow && !underway) {
    for (size_t i = 0; i < op.targets.size(); ++i) {
      if (op.targets[i].empty() || f.regions[i]) continue;
      auto region = device_->local_cache().acquire(op.targets[i].data(), op.targets[i].size());
      if (!region) return region.error();
      f.regions[i] = std::move(region.value());
    }
    missing = 0;
  }
  f.op = op;
  std::shared_ptr<TargetRegistration> registration;
  if (missing > 0) {
    registration = std::make_shared<TargetRegistration>(op.targets, f.regions);
    f.registering = Registering(registration);
  }
  fetches_[op.request_id] = std::move(f);
  if (registration) {
    // Registered off the strand (at least the threshold: a small target inside memory being
    // registered waits there) while the request goes to the owner; the grant waits for it.
    off_strand(
        std::max<uint64_t>(missing, kRegisterOnTheStrandBelow),
        [registration, device = device_] { registration->run(device->local_cache()); },
        [this, id = op.request_id, r = registration.get()] { on_registered(id, r); });
  }
  return op.request;
}

void RdmaChannel::on_registered(uint64_t request_id, TargetRegistration* registration) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end() || it->second.registering.get() != registration) return;  // it ended
  Fetch& f = it->second;
  auto regions = registration->take();
  f.registering.reset();
  if (!regions) {
    f.error = regions.error();
    maybe_finish(request_id);
    return;
  }
  f.regions = std::move(*regions);
  if (f.grant) {
    const wire::Grant grant = std::move(*f.grant);
    f.grant.reset();
    read_granted(request_id, f, grant);
  }
}

void RdmaChannel::off_strand(uint64_t bytes, std::function<void()> job,
                             std::function<void()> then) {
  if (bytes < kRegisterOnTheStrandBelow) {
    job();
    return then();
  }
  auto link = link_.lock();
  if (!link) return;  // the session is gone: this channel closes with it
  // The tracked executor counts as the loop's work until `then` has run (a close waits for it,
  // within its bound). A registration that outlasts the loop's last run is dropped on the
  // registrar thread instead of waiting in a loop that never runs again (post_back).
  std::function<void()> back = guarded(
      *this,
      [work = asio::prefer(strand_.get_inner_executor(), asio::execution::outstanding_work.tracked),
       then = std::move(then)] { then(); });
  submit_registration(bytes, [gate = options_.loop_gate, link = std::move(link),
                              job = std::move(job), back = std::move(back)]() mutable {
    job();
    job = nullptr;
    post_back(gate, std::move(link), std::move(back));
  });
}

void RdmaChannel::on_grant(uint64_t request_id, const wire::Grant& grant) {
  auto it = fetches_.find(request_id);
  FERRY_LOG_DEBUG("rdma: queue pair {}: grant for request {}{}", qp_->qp_num, request_id,
                  it == fetches_.end() ? " (no such fetch: released)" : "");
  if (it == fetches_.end() || it->second.aborted || it->second.granted) {
    send_release(request_id, false);  // aborted meanwhile: end the owner's lease at once
    return;
  }
  auto& f = it->second;
  f.granted = true;
  if (f.registering) {
    f.grant = grant;  // read once the targets are registered (on_registered)
    return;
  }
  read_granted(request_id, f, grant);
}

void RdmaChannel::read_granted(uint64_t request_id, Fetch& f, const wire::Grant& grant) {
  const auto& targets = f.op.targets;
  bool ok = static_cast<size_t>(grant.segments_size()) == targets.size();
  for (size_t i = 0; ok && i < targets.size(); ++i) {
    const auto& seg = grant.segments(static_cast<int>(i));
    ok = seg.length() == targets[i].size() && pieces_cover(seg);
  }
  if (!ok) {
    FERRY_LOG_WARN("rdma: grant for request {} does not match its targets", request_id);
    f.error = make_error_code(errc::protocol_error);
    maybe_finish(request_id);
    return;
  }
  // A READ stays within one of the device's messages, one extent of the owner's and one
  // registration of the target's. The first `skip` bytes an earlier attempt left whole in the
  // targets are not read again.
  const uint64_t chunk = std::min<uint64_t>(kReadChunk, address_.max_msg);
  uint64_t skip = f.op.resume_at;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto base = reinterpret_cast<uintptr_t>(targets[i].data());
    const Region* region = f.regions[i].get();
    uint64_t offset = 0;  // of the extent in the segment
    bool held = false;
    for_each_extent(grant.segments(static_cast<int>(i)), [&](Extent e) {
      if (held) return;
      if (options_.hooks && options_.hooks->armed.load(std::memory_order_acquire)) {
        std::lock_guard lock(options_.hooks->mu);
        if (options_.hooks->tamper && !options_.hooks->tamper(e.addr, e.rkey, e.length)) {
          held = true;
          return;
        }
      }
      if (skip >= e.length) {
        skip -= e.length;
        offset += e.length;
        return;
      }
      for (uint64_t off = std::exchange(skip, 0); off < e.length;) {
        const uintptr_t local = base + offset + off;
        const uint64_t length = std::min(
            {chunk, e.length - off, static_cast<uint64_t>(region->chunk_end(local) - local)});
        f.reads.push_back(Read{local, region->lkey_at(local), e.addr + off, e.rkey,
                               static_cast<uint32_t>(length)});
        off += length;
      }
      offset += e.length;
    });
    if (held) {
      f.reads.clear();
      return;  // held: ends by its deadline or an abort
    }
  }
  if (f.reads.empty()) {
    maybe_finish(request_id);  // an object of zero bytes: nothing to read
    return;
  }
  ready_.push_back(request_id);
  post_reads();
}

int RdmaChannel::post_read(uint64_t request_id, const Read& r) {
  const int rc = post_read_wr(request_id, r);
  if (rc == 0) {
    newest_remote_ = r.remote;
    newest_rkey_ = r.rkey;
    ++reads_posted_;
  }
  return rc;
}

int RdmaChannel::post_read_wr(uint64_t wr_id, const Read& r) {
  ibv_sge sge{};
  sge.addr = r.local;
  sge.length = r.length;
  sge.lkey = r.lkey;
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = r.remote;
  wr.wr.rdma.rkey = r.rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp_.get(), &wr, &bad);
}

void RdmaChannel::post_probe() {
  if (probing_ || !probe_mr_ || closed_ || !connected_ || in_flight_ >= sq_depth_ ||
      reads_done_ == reads_posted_) {
    return;
  }
  // One byte, not 0: rxe answers a retried READ after a zero-length one with an error. From the
  // newest posted READ's remote start: that READ is outstanding (nothing completed since), so its
  // lease, and with it this rkey, is still the owner's grant to us.
  const Read probe{reinterpret_cast<uint64_t>(probe_byte_.get()), probe_mr_->lkey, newest_remote_,
                   newest_rkey_, 1};
  if (post_read_wr(kProbeId, probe) != 0) return;  // the stall bound stays
  probing_ = true;
  probe_behind_ = reads_posted_;
  ++in_flight_;
}

bool RdmaChannel::on_probe(const ibv_wc& wc) {
  probing_ = false;
  if (wc.status == IBV_WC_WR_FLUSH_ERR) return true;  // the pair is failing already
  if (wc.status != IBV_WC_SUCCESS) {
    // Not a fetch's fault: the pair is unusable, its fetches start again.
    FERRY_LOG_WARN("rdma: queue pair {}: the probe READ failed: {}", qp_->qp_num,
                   ibv_wc_status_str(wc.status));
    fail(make_wc_error(wc.status));
    return false;
  }
  if (reads_done_ < probe_behind_) {
    FERRY_LOG_WARN(
        "rdma: queue pair {}: a probe READ completed while {} READs posted before it had not: "
        "the device lost their completions; treating the pair as broken",
        qp_->qp_num, probe_behind_ - reads_done_);
    fail(make_error_code(errc::peer_unresponsive));
    return false;
  }
  return true;
}

void RdmaChannel::post_reads() {
  bool posted_any = false;
  // Oldest first: a fetch posts its READs before any younger one, as far as its window and the
  // pipe allow; a fetch that one READ finishes goes ahead of the pipe's bound (it is never stuck
  // behind a large one). The queue pair executes READs in posting order, so this is the order
  // in which the bytes land: large fetches complete one after another instead of all together
  // at the end, and the fetcher holds few partly received objects.
  bool full = false;
  for (auto pos = ready_.begin(); pos != ready_.end() && !full;) {
    if (closed_ || !connected_ || in_flight_ >= sq_depth_) break;
    auto it = fetches_.find(*pos);
    if (it == fetches_.end() || it->second.reads.empty() || it->second.aborted ||
        it->second.error) {
      pos = ready_.erase(pos);
      continue;
    }
    auto& f = it->second;
    const bool one_read = f.posted == 0 && f.reads.size() == 1;
    while (!f.reads.empty() && f.posted < kWindow && in_flight_ < sq_depth_ &&
           (posted_bytes_ < kPipeBytes || one_read)) {
      const Read r = f.reads.front();
      if (int rc = post_read(*pos, r); rc != 0) {
        if (rc != ENOMEM) return fail(std::error_code(rc, std::system_category()));
        full = true;  // the send queue is fuller than we counted: a completion posts again
        break;
      }
      f.reads.pop_front();
      ++in_flight_;
      ++f.posted;
      posted_bytes_ += r.length;
      f.posted_lengths.push_back(r.length);
      posted_any = true;
    }
    pos = f.reads.empty() ? ready_.erase(pos) : std::next(pos);
  }
  if (posted_any) watch_posted();
}

void RdmaChannel::maybe_finish(uint64_t request_id) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return;
  auto& f = it->second;
  if (f.posted > 0 || (!f.reads.empty() && !f.aborted && !f.error)) return;
  if (f.registering && !f.aborted && !f.error) return;  // its READs are still to come
  const bool granted = f.granted;
  const bool aborted = f.aborted;
  const auto ec = f.error;
  fetches_.erase(it);  // drops the target registrations
  if (granted) send_release(request_id, !aborted && !ec);
  if (auto link = link_.lock()) link->complete_fetch(request_id, aborted ? std::error_code() : ec);
}

bool RdmaChannel::abort_fetch(uint64_t request_id) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return true;
  auto& f = it->second;
  f.reads.clear();  // READs not yet posted are simply dropped
  if (f.posted == 0) {
    if (f.granted) send_release(request_id, false);
    fetches_.erase(it);
    return true;
  }
  // Posted READs cannot be recalled; the fetch completes when they have drained.
  f.aborted = true;
  return false;
}

void RdmaChannel::send_release(uint64_t request_id, bool read) {
  auto link = link_.lock();
  if (!link || !link->is_open()) return;
  wire::Message m;
  m.set_release(read);
  link->send_transport_message(kTransportName, request_id, m.SerializeAsString());
}

// ---------------------------------------------------------------- owner side

void RdmaChannel::send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) {
  // With per-grant registrations the lease registers the granted ranges itself; otherwise the
  // object's registrations are made once, at its first grant on this device.
  const RdmaGrants mode = device_->grants();
  if (mode != RdmaGrants::registrations) {
    if (auto regions = options_.objects->find(*device_, object.object())) {
      auto g = make_grant(object.object(), *regions, options_.lease_timeout);
      return grant(request_id, std::move(object), std::move(*regions), std::move(g),
                   std::move(done));
    }
  }
  // Made here when small, else on a registrar thread: the lease waits meanwhile (an abort or
  // close ends it) while the job pins the object.
  Lease& lease = leases_[request_id];
  lease.done = std::move(done);
  lease.registering = true;
  auto job = std::make_shared<ServeRegistration>();
  job->pin = std::move(object);
  if (mode == RdmaGrants::registrations) {
    // pd_ is own_pd_ on a serving channel; the device's PD otherwise, which the device holds.
    job->pd = own_pd_ ? own_pd_ : std::shared_ptr<ibv_pd>(std::shared_ptr<void>(), pd_);
  }
  // What gets registered: the granted tensors, or, for a view put with PutOptions::region, the
  // whole region at its first grant.
  uint64_t bytes = 0;
  for (const auto& t : job->pin.object().tensors) bytes += t.data.size();
  if (mode != RdmaGrants::registrations) {
    bytes = std::max<uint64_t>(bytes, job->pin.object().region.size());
    // Small ones too when memory around them is being registered now (another object's serve):
    // acquire() waits for that registration.
    for (const auto& t : job->pin.object().tensors) {
      if (!t.data.empty() &&
          device_->remote_cache().being_registered(t.data.data(), t.data.size())) {
        bytes = std::max<uint64_t>(bytes, kRegisterOnTheStrandBelow);
      }
    }
  }
  off_strand(
      bytes,
      [job, mode, device = device_, objects = options_.objects, lease_ms = options_.lease_timeout] {
        const StoredObject& object = job->pin.object();
        if (mode == RdmaGrants::registrations) {
          job->grant = make_grant(object, {}, lease_ms);
          if (!register_segments(*device, job->pd.get(), job->grant, job->registrations)) {
            job->error = make_error_code(errc::device_error);
          }
          return;
        }
        auto regions = objects->acquire(*device, object);
        if (!regions) {
          job->error = regions.error();
          return;
        }
        job->regions = std::move(*regions);
        job->grant = make_grant(object, job->regions, lease_ms);
      },
      [this, request_id, job] { on_serve_registered(request_id, *job); });
}

void RdmaChannel::on_serve_registered(uint64_t request_id, ServeRegistration& done) {
  auto it = leases_.find(request_id);
  if (it == leases_.end() || !it->second.registering) return;  // ended: `done` drops it all
  Lease& lease = it->second;
  lease.registering = false;
  lease.pin = std::move(done.pin);
  if (done.error) {
    end_lease(request_id, done.error);
    return;
  }
  start_lease(request_id, std::move(done.regions), std::move(done.grant),
              std::move(done.registrations));
}

bool RdmaChannel::abort(uint64_t request_id) {
  if (end_lease(request_id, make_error_code(errc::aborted))) return true;  // owner side
  return abort_fetch(request_id);                                          // fetcher side
}

bool RdmaChannel::on_message(uint64_t request_id, std::string_view payload) {
  auto link = link_.lock();
  wire::Message m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    if (link) {
      FERRY_LOG_WARN("rdma: malformed control message from peer '{}'", link->info().name);
      link->fail(make_error_code(errc::protocol_error));
    }
    return true;
  }
  switch (m.body_case()) {
    case wire::Message::kGrant:
      on_grant(request_id, m.grant());
      return true;
    case wire::Message::kRelease: {
      // A fetch whose READs failed (or that was aborted) ends the lease without being served;
      // one that succeeded after this side's lease ended (its queue pair broke) still counts.
      const bool read = m.release();
      const bool leased =
          end_lease(request_id, read ? std::error_code() : make_error_code(errc::aborted));
      if (!leased && read && link) link->settle(request_id);
      return true;
    }
    case wire::Message::kReset:
      if (link && link->info().initiator) on_peer_reset();
      return true;
    default:
      return false;  // queue pair setup (or unknown): the transport's
  }
}

void RdmaChannel::grant(uint64_t request_id, ObjectStore::Pin pin,
                        std::vector<std::shared_ptr<Region>> regions, wire::Grant grant,
                        SendDone done) {
  Lease& lease = leases_[request_id];
  lease.pin = std::move(pin);
  lease.done = std::move(done);
  start_lease(request_id, std::move(regions), std::move(grant), {});
}

void RdmaChannel::start_lease(uint64_t request_id, std::vector<std::shared_ptr<Region>> regions,
                              wire::Grant grant, std::vector<GrantMrHandle> registrations) {
  Lease& lease = leases_.at(request_id);
  lease.timer =
      std::make_unique<asio::steady_timer>(strand_.get_inner_executor(), options_.lease_timeout);
  lease.timer->async_wait(asio::bind_executor(
      strand_, [weak = weak_from_this(), request_id](boost::system::error_code ec) {
        auto self = weak.lock();
        if (ec || !self) return;
        if (self->end_lease(request_id, make_error_code(errc::timed_out))) {
          FERRY_LOG_WARN("rdma: lease for request {} expired", request_id);
        }
      }));
  if (device_->grants() == RdmaGrants::registrations) {
    lease.registrations = std::move(registrations);
    lease.grant = std::move(grant);
    return send_grant(request_id, lease.grant);
  }
  if (device_->grants() != RdmaGrants::windows) return send_grant(request_id, grant);
  // One window per extent: each is bound over the registration that holds it.
  lease.regions = std::move(regions);
  for (int i = 0; i < grant.segments_size(); ++i) {
    if (!lease.regions[i]) continue;
    for_each_extent(grant.segments(i), [&](const Extent& e) {  // describe()'s: well formed
      lease.binds.push_back(Bind{i, e.piece, lease.regions[i]->mr_at(e.addr), e.addr, e.length});
    });
  }
  for (size_t i = 0; i < lease.binds.size(); ++i) {
    lease.windows.push_back(device_->alloc_window());
    if (!lease.windows.back()) {
      FERRY_LOG_WARN("rdma: cannot allocate a memory window on {}: {}", device_->name(),
                     last_errno().message());
      end_lease(request_id, make_error_code(errc::device_error));
      return;
    }
  }
  lease.grant = std::move(grant);
  binds_waiting_.push_back(request_id);
  post_binds();
}

void RdmaChannel::post_binds() {
  bool posted_any = false;
  while (!closed_ && connected_ && !binds_waiting_.empty()) {
    auto it = leases_.find(binds_waiting_.front());
    if (it == leases_.end()) {  // ended meanwhile
      binds_waiting_.pop_front();
      continue;
    }
    const uint64_t id = it->first;
    Lease& lease = it->second;
    while (lease.next_bind < lease.binds.size() && in_flight_ < sq_depth_) {
      const size_t i = lease.next_bind;
      const Bind& b = lease.binds[i];
      ibv_send_wr wr{};
      wr.wr_id = id | kBindBit;
      wr.opcode = IBV_WR_BIND_MW;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.bind_mw.mw = lease.windows[i].get();
      wr.bind_mw.rkey = ibv_inc_rkey(lease.windows[i]->rkey);
      wr.bind_mw.bind_info.mr = b.mr;
      wr.bind_mw.bind_info.addr = b.addr;
      wr.bind_mw.bind_info.length = b.length;
      wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(qp_.get(), &wr, &bad); rc != 0) {
        if (rc == ENOMEM) break;  // fuller than we counted: wait for completions
        FERRY_LOG_WARN("rdma: cannot post a memory-window bind: {}", std::strerror(rc));
        fail(std::error_code(rc, std::system_category()));
        return;
      }
      set_extent_rkey(*lease.grant.mutable_segments(b.segment), b.piece, wr.bind_mw.rkey);
      ++lease.next_bind;
      ++lease.binding;
      ++in_flight_;
      posted_any = true;
    }
    if (lease.next_bind < lease.binds.size()) break;  // the send queue is full
    binds_waiting_.pop_front();
    if (lease.binding == 0) send_grant(id, lease.grant);  // nothing needed binding
  }
  if (posted_any) watch_posted();
}

void RdmaChannel::on_bound(uint64_t request_id) {
  if (auto it = leases_.find(request_id); it != leases_.end()) {
    Lease& lease = it->second;
    if (lease.binding) --lease.binding;
    // The bind's completion means the window is usable: only now may the peer READ through it.
    if (lease.binding == 0 && lease.next_bind == lease.binds.size()) {
      send_grant(request_id, lease.grant);
    }
    return;
  }
  if (auto it = retired_.find(request_id); it != retired_.end()) {
    if (--it->second.binding == 0) retired_.erase(it);  // deallocates the windows
  }
}

void RdmaChannel::send_grant(uint64_t request_id, const wire::Grant& grant) {
  auto link = link_.lock();
  FERRY_LOG_DEBUG("rdma: queue pair {}: grant for request {} sent", qp_->qp_num, request_id);
  if (!link || !link->is_open()) return;
  wire::Message m;
  *m.mutable_grant() = grant;
  link->send_transport_message(kTransportName, request_id, m.SerializeAsString());
}

bool RdmaChannel::end_lease(uint64_t request_id, std::error_code ec) {
  auto it = leases_.find(request_id);
  if (it == leases_.end()) return false;
  auto lease = std::move(it->second);
  leases_.erase(it);
  if (lease.timer) lease.timer->cancel();
  // Windows and grant registrations go first (deallocating or deregistering invalidates the
  // rkey), then the pin. A lease with a bind still in flight keeps all of them, the pin
  // included, until its binds complete: a window bound (or binding) over the object's memory
  // must not outlive its registration, nor the registration the object.
  if (lease.binding > 0) {
    retired_[request_id] = Retired{lease.binding, std::move(lease.pin), std::move(lease.regions),
                                   std::move(lease.registrations), std::move(lease.windows)};
  }
  lease.windows.clear();
  lease.registrations.clear();
  lease.pin.reset();  // the object may be collected now; its registration goes with it
  if (lease.done) lease.done(ec);
  return true;
}

// ---------------------------------------------------------------- failure and close

void RdmaChannel::to_error_state() {
  if (!qp_) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_.get(), &a, IBV_QP_STATE);  // flushes every outstanding work request
}

void RdmaChannel::out_of_memory() { fail_peer(link_, *this, errc::resource_exhausted); }

void RdmaChannel::fail(std::error_code ec) {
  if (closed_) return;
  // In the error state the QP takes no new work and flushes what is outstanding, but rxe may go
  // on placing responses it took in until the QP is destroyed (QuiesceBoard): a fetch that ends
  // here with READs posted completes once it is, and the fetches that start again wait for a new
  // pair, which waits for the same.
  to_error_state();
  ready_.clear();
  auto link = link_.lock();
  quiesce_if_reading(link.get());
  auto fetches = std::move(fetches_);
  fetches_.clear();
  // Their READs are gone with the queue pair and none of them failed on its own account: each is
  // started again over a new pair (the session's restart waits for drop_channel below).
  size_t restarted = 0;
  for (auto& [id, f] : fetches) {
    if (f.granted) send_release(id, false);
    if (!link) continue;
    if (f.aborted || f.error) {
      const auto result = f.aborted ? std::error_code() : f.error;
      if (f.posted > 0 && quiet_) {
        complete_when_quiet(link, id, result, std::move(f));
      } else {
        link->complete_fetch(id, result);
      }
    } else {
      link->restart_fetch(id, ec, f.op.resume_at + f.landed);
      ++restarted;
    }
  }
  if (restarted > 0) {
    FERRY_LOG_WARN(
        "rdma: queue pair {} failed ({}): {} of its fetches go on over a new pair from where "
        "they stopped (each at most {} times in a row without progress)",
        qp_->qp_num, ec.message(), restarted, kMaxFetchRestarts);
  }
  if (link && !link->info().initiator && link->is_open()) {
    // The fetcher's queue pair still looks fine from its side, but talks to this dead one: tell
    // it to fail its own, so that its next fetch sets up a new pair instead of asking an owner
    // that has no channel (and being refused).
    wire::Message m;
    m.set_reset(true);
    link->send_transport_message(kTransportName, 0, m.SerializeAsString());
  }
  if (link) {
    link->drop_channel(kTransportName, ec);  // calls close()
  } else {
    close(ec);
  }
}

void RdmaChannel::complete_when_quiet(std::shared_ptr<PeerLink> link, uint64_t id,
                                      std::error_code ec, Fetch f) {
  auto held = std::make_shared<Fetch>(std::move(f));
  options_.quiesce->when_quiet(*link, [link, id, ec, held]() mutable {
    held.reset();  // its regions, here on the strand, before the caller gets the targets back
    link->complete_fetch(id, ec);
  });
}

bool RdmaChannel::quiesce_if_reading(const PeerLink* link) {
  if (quiet_) return true;
  const bool reading = std::any_of(fetches_.begin(), fetches_.end(),
                                   [](const auto& entry) { return entry.second.posted > 0; });
  if (!reading || !link || !options_.quiesce) return false;
  quiet_ = options_.quiesce->add(link, strand_, options_.quiesce_timeout);
  return true;
}

void RdmaChannel::on_peer_reset() {
  // Fails the channel at once instead of after the flushed completions (fail() puts the QP in
  // the error state, where it places no more data): the flush can take seconds (rxe), and new
  // fetches must not join a pair whose owner side is gone, where each would be refused.
  fail(make_wc_error(IBV_WC_GENERAL_ERR));
}

void RdmaChannel::post_inject_error() {
  asio::post(guarded(*this, [this] { fail(make_wc_error(IBV_WC_GENERAL_ERR)); }));
}

void RdmaChannel::close(std::error_code ec) {
  if (closed_) return;
  closed_ = true;
  to_error_state();
  boost::system::error_code ignored;
  cq_fd_.cancel(ignored);
  safety_timer_.cancel();
  ready_.clear();
  // The session completes the fetches (RdmaTransport::when_quiet). Those with READs posted keep
  // their target registrations until the pair is destroyed: it may still place responses it took
  // in, and the session hands their targets back only then.
  auto link = link_.lock();
  if (quiesce_if_reading(link.get())) {
    auto held = std::make_shared<decltype(fetches_)>(std::move(fetches_));
    options_.quiesce->when_quiet(*link, [held]() mutable { held.reset(); });
  }
  fetches_.clear();
  std::vector<uint64_t> ids;
  for (auto& [id, lease] : leases_) ids.push_back(id);
  for (uint64_t id : ids) end_lease(id, ec);
}

}  // namespace ferry::rdma
