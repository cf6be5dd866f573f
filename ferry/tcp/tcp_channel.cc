#include "ferry/tcp/tcp_channel.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <limits>

#include "ferry/net/core/guard.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/tcp/tcp_transport.h"

namespace ferry::tcp {
namespace asio = boost::asio;

namespace {
constexpr size_t kScratchBytes = 256 * 1024;
// Bytes read at once while a chunk header is expected (small chunks arrive whole in one call).
constexpr size_t kStageBytes = 16 * 1024;
// Bytes read at once into combining_ for a request that combines: small enough to stay in the
// core's cache until they are combined, large enough to keep system calls few.
constexpr size_t kCombineBytes = 128 * 1024;
// Bytes one handler may receive before yielding the strand to other work of the peer.
constexpr size_t kReadBudget = 16u << 20;

// async_write's completion condition: everything, in as few system calls as the socket takes
// (asio's default, transfer_all, hands at most 64 KiB to each call).
size_t whole(const boost::system::error_code& ec, size_t /*written*/) {
  return ec ? 0 : std::numeric_limits<size_t>::max();
}
}  // namespace

TcpChannel::TcpChannel(std::shared_ptr<PeerLink> link, asio::ip::tcp::socket socket,
                       size_t chunk_bytes)
    : link_(link), strand_(link->strand()), socket_(std::move(socket)), chunk_bytes_(chunk_bytes) {
  boost::system::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  socket_.non_blocking(true, ignored);
}

void TcpChannel::start() {
  stage_.resize(kStageBytes);
  arm_read();
}

// ---------------------------------------------------------------- receiving

Result<FetchRequest> TcpChannel::recv_multiple(const FetchOp& op) {
  Recv r;
  r.targets = op.targets;
  r.combine = op.combine;
  r.request = op.request;
  r.written.reserve(op.targets.size());
  for (const auto& t : op.targets) r.written.emplace_back(t.size());
  recvs_[op.request_id] = std::move(r);
  return op.request;
}

void TcpChannel::arm_read() {
  if (closed_) return;
  if (read_state_ == ReadState::payload) {
    // Mid-payload more bytes are on their way: wait for them and read them straight into the
    // target from the handler (a queued read can only use stage_, and would cost a copy).
    socket_.async_wait(asio::ip::tcp::socket::wait_read,
                       guarded(*this, [this](boost::system::error_code ec) {
                         if (ec) return fail(errc::peer_closed);
                         on_readable();
                       }));
    return;
  }
  // Between chunks: a read into stage_, which the channel owns (never a target: a read queued in
  // the reactor would land in a target after its fetch was aborted). Asio tries it at once and
  // otherwise queues it for the socket's next readiness; unlike async_wait it does not
  // re-register the socket with epoll (a system call, and a spurious writable event after it).
  socket_.async_read_some(asio::buffer(stage_),
                          guarded(*this, [this](boost::system::error_code ec, size_t n) {
                            if (ec) return fail(errc::peer_closed);
                            if (!consume_stage(n)) return;
                            // A read that did not fill the stage emptied the socket: wait for more.
                            // Otherwise more may be queued: read on from the handler.
                            if (n < stage_.size()) return arm_read();
                            on_readable();
                          }));
}

void TcpChannel::on_readable() {
  const int fd = socket_.native_handle();
  size_t budget = kReadBudget;
  while (!closed_) {
    // One read takes the rest of the current chunk's payload (into its target, or through
    // scratch_ / combining_) and, when that is all of it, the bytes after it into stage_ (the
    // next headers, small chunks whole): a read that fills less than both emptied the socket.
    iovec iov[2];
    int count = 0;
    size_t into_payload = 0;
    if (read_state_ == ReadState::payload) {
      std::byte* dst = payload_dst_;
      size_t want = static_cast<size_t>(payload_left_);
      if (!dst) {
        if (scratch_.empty()) scratch_.resize(kScratchBytes);
        dst = scratch_.data();
        want = std::min(want, scratch_.size());
      } else if (combine_) {
        if (combining_.empty()) combining_.resize(kCombineBytes);
        dst = combining_.data();
        want = std::min(want, combining_.size());
      }
      iov[count++] = {dst, want};
      into_payload = want;
    }
    if (read_state_ == ReadState::header || into_payload == payload_left_) {
      iov[count++] = {stage_.data(), stage_.size()};
    }
    size_t asked = 0;
    for (int i = 0; i < count; ++i) asked += iov[i].iov_len;
    const ssize_t n = ::readv(fd, iov, count);
    if (n > 0) {
      const size_t got = static_cast<size_t>(n);
      const size_t payload = std::min(got, into_payload);
      if (payload > 0) {
        payload_left_ -= payload;
        if (payload_dst_) {
          if (combine_) (*combine_)({payload_dst_, payload}, {combining_.data(), payload});
          payload_dst_ += payload;
        }
        if (payload_left_ == 0) end_payload();
      }
      if (got > payload && !consume_stage(got - payload)) return;
      if (got < asked) return arm_read();
      if (got >= budget) {
        // Yield the strand to the peer's other work; read on after it.
        asio::post(guarded(*this, [this] { on_readable(); }));
        return;
      }
      budget -= got;
      continue;
    }
    if (n == 0) return fail(errc::peer_closed);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return arm_read();
    return fail(std::error_code(errno, std::system_category()));
  }
}

bool TcpChannel::consume_stage(size_t n) {
  const std::byte* p = stage_.data();
  const std::byte* end = p + n;
  while (p < end && !closed_) {
    const size_t avail = static_cast<size_t>(end - p);
    if (read_state_ == ReadState::header) {
      const size_t take = std::min(sizeof(DataHeader) - header_got_, avail);
      std::memcpy(reinterpret_cast<std::byte*>(&header_) + header_got_, p, take);
      header_got_ += take;
      p += take;
      if (header_got_ == sizeof(DataHeader) && !on_header()) return false;
    } else {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(payload_left_, avail));
      if (payload_dst_) {
        if (combine_) {
          (*combine_)({payload_dst_, take}, {p, take});
        } else {
          std::memcpy(payload_dst_, p, take);
        }
        payload_dst_ += take;
      }
      payload_left_ -= take;
      p += take;
      if (payload_left_ == 0) end_payload();
    }
  }
  return !closed_;
}

void TcpChannel::end_payload() {
  read_state_ = ReadState::header;
  header_got_ = 0;
  if (auto it = recvs_.find(header_.request_id); it != recvs_.end()) {
    it->second.request.report_landed(header_.length);
  }
  if (header_.flags & kFlagEnd) finish_request();
}

bool TcpChannel::on_header() {
  if (header_.magic != kDataMagic) {
    FERRY_LOG_WARN("TCP data channel: bad chunk header; closing the peer");
    fail(errc::protocol_error);
    return false;
  }
  payload_dst_ = nullptr;
  combine_ = nullptr;
  payload_left_ = header_.length;
  auto it = recvs_.find(header_.request_id);
  if (it != recvs_.end()) {
    auto& r = it->second;
    // Every byte of a target is written once: a chunk outside it, or over bytes an earlier chunk
    // wrote, is the owner's error, not a fetch's success.
    if (header_.tensor >= r.targets.size() ||
        !r.written[header_.tensor].add(header_.offset, header_.length)) {
      FERRY_LOG_WARN(
          "TCP data channel: chunk [{}, +{}) of tensor {} is outside its target or overlaps "
          "bytes already received, in request {}; closing the peer",
          header_.offset, header_.length, header_.tensor, header_.request_id);
      fail(errc::protocol_error);
      return false;
    }
    payload_dst_ = r.targets[header_.tensor].data() + header_.offset;
    if (r.combine) combine_ = &r.combine;
  }
  // Unknown requests (aborted, timed out) are read into scratch and dropped.
  if (payload_left_ > 0) {
    read_state_ = ReadState::payload;
    return true;
  }
  // An empty chunk: only meaningful as the end marker.
  header_got_ = 0;
  if (header_.flags & kFlagEnd) finish_request();
  return true;
}

void TcpChannel::finish_request() {
  auto it = recvs_.find(header_.request_id);
  if (it == recvs_.end()) return;  // aborted meanwhile: its bytes were dropped
  const auto& written = it->second.written;
  const bool complete =
      std::all_of(written.begin(), written.end(), [](const Coverage& c) { return c.complete(); });
  if (!complete) {
    FERRY_LOG_WARN("TCP data channel: request {} ended with bytes of its targets never sent",
                   header_.request_id);
  }
  recvs_.erase(it);
  if (auto link = link_.lock()) {
    if (complete && (header_.flags & kFlagAckWanted)) {
      link->send_transport_message(kTransportName, header_.request_id, {});
    }
    link->complete_fetch(header_.request_id, complete ? std::error_code() : errc::protocol_error);
  }
}

// ---------------------------------------------------------------- sending

void TcpChannel::send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) {
  if (closed_) {
    done(errc::peer_closed);
    return;
  }
  Send s;
  s.request_id = request_id;
  s.object = std::move(object);
  s.done = std::move(done);
  s.ack = static_cast<bool>(s.object.object().on_served);
  for (const auto& t : s.object.object().tensors) s.left += t.data.size();
  s.moved_at = written_;
  sends_.push_back(std::move(s));
  pump();
}

bool TcpChannel::on_message(uint64_t request_id, std::string_view payload) {
  auto link = link_.lock();
  if (!payload.empty()) {
    if (link) FERRY_LOG_WARN("TCP: unknown control message from peer '{}'", link->info().name);
    return true;
  }
  // Not waited for by the channel: its send failed when a broken connection took it.
  if (!on_ack(request_id) && link) link->settle(request_id);
  return true;
}

bool TcpChannel::on_ack(uint64_t request_id) {
  auto it = awaiting_ack_.find(request_id);
  if (it == awaiting_ack_.end()) {
    // The fetcher can answer before this side has seen its last write complete.
    auto s = find_send(request_id);
    if (s == sends_.end() || !s->sent_end || !s->done) return false;
    s->acked = true;
    return true;
  }
  auto done = std::move(it->second);
  awaiting_ack_.erase(it);
  if (done) done({});
  return true;
}

std::deque<TcpChannel::Send>::iterator TcpChannel::next_send() {
  // Enough to find the short requests among a window of large ones; a long queue of small
  // requests is served nearly in order anyway.
  constexpr size_t kPickWindow = 64;
  constexpr uint64_t kBypassChunks = 16;
  auto oldest = sends_.begin();
  if (oldest->left <= chunk_bytes_ || written_ - oldest->moved_at >= kBypassChunks * chunk_bytes_) {
    return oldest;
  }
  const auto end =
      sends_.begin() + static_cast<std::ptrdiff_t>(std::min(sends_.size(), kPickWindow));
  for (auto it = std::next(oldest); it != end; ++it) {
    if (it->left <= chunk_bytes_) return it;  // one chunk finishes it: it goes first
  }
  return oldest;
}

std::deque<TcpChannel::Send>::iterator TcpChannel::find_send(uint64_t request_id) {
  return std::find_if(sends_.begin(), sends_.end(),
                      [request_id](const Send& s) { return s.request_id == request_id; });
}

void TcpChannel::pump() {
  if (writing_ || closed_ || sends_.empty()) return;
  Send& s = *next_send();
  const auto& tensors = s.object.object().tensors;
  while (s.tensor < tensors.size() && s.offset >= tensors[s.tensor].data.size()) {
    ++s.tensor;
    s.offset = 0;
  }
  const std::byte* data = nullptr;
  uint64_t len = 0;
  if (s.tensor < tensors.size()) {
    data = tensors[s.tensor].data.data() + s.offset;
    len = std::min<uint64_t>(chunk_bytes_, tensors[s.tensor].data.size() - s.offset);
  }
  bool last = true;
  if (s.tensor < tensors.size()) {
    if (s.offset + len < tensors[s.tensor].data.size()) last = false;
    for (size_t i = s.tensor + 1; last && i < tensors.size(); ++i) {
      if (!tensors[i].data.empty()) last = false;
    }
  }
  out_header_ = DataHeader{};
  out_header_.flags = last ? kFlagEnd | (s.ack ? kFlagAckWanted : 0) : 0;
  out_header_.request_id = s.request_id;
  out_header_.tensor = s.tensor < tensors.size() ? static_cast<uint32_t>(s.tensor) : 0;
  out_header_.offset = s.offset;
  out_header_.length = len;
  s.offset += len;
  s.left -= len;
  s.sent_end = last;
  written_ += len;
  s.moved_at = written_;
  writing_ = true;
  writing_request_ = s.request_id;
  std::array<asio::const_buffer, 2> buffers{asio::buffer(&out_header_, sizeof(out_header_)),
                                            asio::buffer(data, len)};
  asio::async_write(socket_, buffers, whole,
                    guarded(*this, [this](boost::system::error_code ec, size_t) {
                      writing_ = false;
                      if (ec) return fail(errc::peer_closed);
                      auto it = find_send(writing_request_);  // an abort keeps it until now
                      if (it != sends_.end() && it->sent_end) finish_send(it, {});
                      pump();
                    }));
}

void TcpChannel::finish_send(std::deque<Send>::iterator it, std::error_code ec) {
  auto done = std::move(it->done);
  const bool ack = it->ack && !it->acked && !ec;
  const uint64_t request_id = it->request_id;
  sends_.erase(it);  // drops the pin: the bytes are written
  if (ack && done) {
    awaiting_ack_.emplace(request_id, std::move(done));
  } else if (done) {
    done(ec);
  }
}

// ---------------------------------------------------------------- abort and close

bool TcpChannel::abort(uint64_t request_id) {
  // Receives land only inside strand handlers, so dropping the request releases it at once.
  // Receive side: stop landing bytes in its targets, now.
  if (recvs_.erase(request_id) && read_state_ == ReadState::payload &&
      header_.request_id == request_id) {
    payload_dst_ = nullptr;
    combine_ = nullptr;
  }
  if (auto it = awaiting_ack_.find(request_id); it != awaiting_ack_.end()) {
    auto done = std::move(it->second);
    awaiting_ack_.erase(it);
    if (done) done(errc::aborted);
    return true;
  }
  // Send side: a chunk being written finishes first (its bytes are in flight), then the send
  // ends with an end marker missing: the fetcher has dropped the request already.
  auto it = find_send(request_id);
  if (it == sends_.end()) return true;
  if (writing_ && request_id == writing_request_) {
    it->sent_end = true;  // finish after this chunk
    auto done = std::move(it->done);
    it->done = nullptr;
    if (done) done(errc::aborted);
  } else {
    finish_send(it, errc::aborted);
  }
  return true;
}

void TcpChannel::out_of_memory() { fail(errc::resource_exhausted); }

void TcpChannel::fail(std::error_code ec) {
  if (!closed_) fail_peer(link_, *this, ec);
}

void TcpChannel::close(std::error_code ec) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);  // after this no read or write touches any buffer
  recvs_.clear();
  auto sends = std::move(sends_);
  sends_.clear();
  auto awaiting = std::move(awaiting_ack_);
  awaiting_ack_.clear();
  for (auto& s : sends) {
    if (s.done) s.done(ec);
  }
  for (auto& [id, done] : awaiting) {
    if (done) done(ec);
  }
}

}  // namespace ferry::tcp
