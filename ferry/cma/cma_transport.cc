#include "ferry/cma/cma_transport.h"

#include <unistd.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <limits>
#include <optional>
#include <random>
#include <system_error>

#include "ferry/cma/cma_channel.h"
#include "ferry/cma/copier.h"
#include "ferry/cma/lease_board.h"
#include "ferry/cma/process_memory.h"
#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry::cma {
namespace {

// A descriptor is "<host identity> <pid>" (the pid for people: the channel's messages carry the
// one that is read); whether `descriptor` is from `host`.
bool from_host(std::string_view host, std::string_view descriptor) {
  const size_t space = descriptor.rfind(' ');
  return space != std::string_view::npos && descriptor.substr(0, space) == host;
}

// The registry's factory: every context on this host can use CMA (whether a peer can is found
// per channel).
Result<std::shared_ptr<TransportManager>> make(const TransportEnv& env, const CmaOptions& options) {
  return std::shared_ptr<TransportManager>(std::make_shared<CmaTransport>(env, options));
}

// A process id from the wire, if it can be one.
std::optional<pid_t> wire_pid(uint64_t pid) {
  if (pid == 0 || pid > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) {
    return std::nullopt;
  }
  return static_cast<pid_t>(pid);
}

}  // namespace

struct CmaTransport::Opening {
  ChannelOpenHandler done;
  std::unique_ptr<boost::asio::steady_timer> timer;  // bounds the wait for the answer
};

CmaTransport::CmaTransport(const TransportEnv& env, const CmaOptions& options)
    : host_(host_identity()),
      open_timeout_(env.options.handshake_timeout),
      copy_step_(options.copy_step ? options.copy_step : CmaOptions{}.copy_step),
      // A grant that carries bytes is a metadata frame: well inside the frame limit.
      inline_bytes_(std::min<size_t>(options.inline_bytes, env.options.max_frame_bytes / 4)),
      lease_timeout_(env.options.lease_timeout),
      copy_threads_(options.copy_threads ? options.copy_threads : default_copy_threads()),
      counters_(std::make_shared<Counters>()),
      board_(std::make_shared<LeaseBoard>()),
      probe_value_(std::random_device{}() | 1) {
  info_.name = kTransportName;
  info_.devices = {"cpu"};
  info_.descriptor = host_ + " " + std::to_string(getpid());
  info_.priority = options.preferred ? 50 : 1;  // RDMA 100 > CMA preferred > TCP 10 > CMA
}

CmaTransport::~CmaTransport() = default;

TransportInfo CmaTransport::local_info() const { return info_; }

bool CmaTransport::peer_has_transport(const PeerInfo& peer) const {
  const TransportInfo* theirs = peer.find_transport(kTransportName);
  if (!theirs || !from_host(host_, theirs->descriptor)) return false;
  std::lock_guard lock(mu_);
  return unreadable_.count(peer.session_id) == 0;
}

void CmaTransport::async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) {
  auto opening = std::make_shared<Opening>();
  opening->done = std::move(done);
  opening->timer = std::make_unique<boost::asio::steady_timer>(link->strand(), open_timeout_);
  {
    std::lock_guard lock(mu_);
    opening_[link.get()] = opening;
  }
  opening->timer->async_wait(boost::asio::bind_executor(
      link->strand(), [this, key = link.get(), opening](boost::system::error_code ec) {
        if (ec) return;  // answered in time (the timer was cancelled)
        {
          std::lock_guard lock(mu_);
          auto it = opening_.find(key);
          if (it == opening_.end() || it->second != opening) return;  // answered in time
          opening_.erase(it);
        }
        opening->done(make_error_code(errc::handshake_failed), nullptr);
      }));
  wire::Message m;
  describe(*m.mutable_open());
  link->send_transport_message(kTransportName, 0, m.SerializeAsString());
}

void CmaTransport::on_transport_message(PeerLink& link, uint64_t, std::string_view payload) {
  wire::Message m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return link.fail(errc::protocol_error);
  }
  if (m.has_open()) {  // acceptor: our side of the channel
    wire::Message answer;
    const auto pid = wire_pid(m.open().pid());
    if (m.open().host() != host_ || !pid) {
      answer.set_refuse("not on this host");
    } else {
      // Serving needs nothing of the kernel; fetching from the peer over this channel needs
      // its memory: where that is refused, this side's fetches from it use another transport.
      if (auto ec = probe(link, *pid, m.open())) {
        FERRY_LOG_WARN(
            "CMA: cannot read the memory of peer '{}' (pid {}): {}; fetches from it "
            "use another transport",
            link.info().name, *pid, ec.message());
      }
      try {
        link.install_channel(kTransportName, make_channel(link, *pid));
        describe(*answer.mutable_welcome());
      } catch (const std::system_error& e) {
        // No copier threads: this side cannot take part (bad_alloc ends the session instead).
        FERRY_LOG_WARN("CMA: no channel for peer '{}': {}", link.info().name, e.what());
        answer.set_refuse("no channel here");
      }
    }
    return link.send_transport_message(kTransportName, 0, answer.SerializeAsString());
  }
  if (!m.has_welcome() && !m.has_refuse()) return;  // for a channel that is gone
  std::shared_ptr<Opening> opening;                 // initiator: the answer to our open
  {
    std::lock_guard lock(mu_);
    auto it = opening_.find(&link);
    if (it == opening_.end()) return;
    opening = std::move(it->second);
    opening_.erase(it);
  }
  opening->timer->cancel();
  if (m.has_refuse()) {
    FERRY_LOG_WARN("CMA: peer '{}' refused a channel: {}", link.info().name, m.refuse());
    return opening->done(make_error_code(errc::transport_unavailable), nullptr);
  }
  const auto& w = m.welcome();
  const auto pid = wire_pid(w.pid());
  std::error_code ec =
      w.host() != host_ || !pid ? std::error_code(errc::protocol_error) : probe(link, *pid, w);
  if (ec) {
    FERRY_LOG_WARN(
        "CMA: cannot read the memory of peer '{}' (pid {}): {}; its fetches use another transport "
        "(reading another process needs the same user and kernel.yama.ptrace_scope 0, or root)",
        link.info().name, w.pid(), ec.message());
    return opening->done(make_error_code(errc::transport_unavailable), nullptr);
  }
  std::shared_ptr<CmaChannel> channel;
  try {
    channel = make_channel(link, *pid);
  } catch (const std::system_error& e) {
    // No copier threads (bad_alloc ends the session, which fails the open): `done` still runs.
    FERRY_LOG_WARN("CMA: no channel for peer '{}': {}", link.info().name, e.what());
    return opening->done(make_error_code(errc::transport_unavailable), nullptr);
  }
  opening->done({}, std::move(channel));
}

void CmaTransport::describe(wire::Open& open) const {
  open.set_host(host_);
  open.set_pid(static_cast<uint64_t>(getpid()));
  open.set_probe(reinterpret_cast<uint64_t>(&probe_value_));
  open.set_probe_value(probe_value_);
}

std::error_code CmaTransport::probe(PeerLink& link, pid_t pid, const wire::Open& theirs) {
  uint64_t seen = 0;
  auto ec =
      read_process_memory(pid, reinterpret_cast<std::byte*>(&seen), theirs.probe(), sizeof seen);
  if (!ec && seen != theirs.probe_value()) ec = errc::protocol_error;
  if (ec) {
    ++counters_->refused;
    std::lock_guard lock(mu_);
    unreadable_.insert(link.info().session_id);
  }
  return ec;
}

std::shared_ptr<CmaChannel> CmaTransport::make_channel(PeerLink& link, pid_t pid) {
  CmaChannel::Config config{copy_step_, inline_bytes_, lease_timeout_, nullptr, board_, counters_};
  {
    std::lock_guard lock(mu_);
    if (!copier_) copier_ = std::make_shared<Copier>(copy_threads_);
    config.copier = copier_;
  }
  return std::make_shared<CmaChannel>(link.shared_link(), pid, std::move(config));
}

std::vector<TransportMetric> CmaTransport::metrics() const {
  return {
      {"bytes_copied_total", "Bytes copied out of owners' memory into fetch targets.", false,
       static_cast<double>(counters_->bytes.load())},
      {"fetches_total", "Fetches completed with every byte copied while the owner held the object.",
       false, static_cast<double>(counters_->fetches.load())},
      {"channels_refused_total",
       "Channels not opened because the kernel did not let this process read the peer's memory.",
       false, static_cast<double>(counters_->refused.load())},
  };
}

void CmaTransport::garbage_collect(const StoredObject&) {}

bool register_cma_transport() {
  // Once per process; a second call finds it registered.
  static const std::error_code ec =
      register_transport<CmaOptions>(kTransportName, {"cpu"}, &make, &CmaOptions::from_environment);
  return !ec || ec == errc::transport_duplicate;
}

}  // namespace ferry::cma
