#include "ferry/rdma/rdma_transport.h"

#include <boost/asio/bind_executor.hpp>

#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/rdma/devices.h"
#include "ferry/rdma/registrar.h"

namespace ferry::rdma {
namespace asio = boost::asio;

namespace {

void send(PeerLink& link, uint64_t request_id, const wire::Message& m) {
  link.send_transport_message(kTransportName, request_id, m.SerializeAsString());
}

}  // namespace

RdmaTransport::RdmaTransport(const TransportEnv& env, const RdmaOptions& options,
                             std::vector<std::shared_ptr<Device>> devices, ForkSafety fork)
    : devices_(std::move(devices)),
      channel_options_{options.busy_poll,
                       env.options.lease_timeout,
                       std::make_shared<Hooks>(),
                       env.options.peer_timeout,
                       std::make_shared<ObjectRegions>(),
                       std::make_shared<QuiesceBoard>(env.loop_gate),
                       options.quiesce_timeout,
                       env.loop_gate},
      open_timeout_(env.options.handshake_timeout),
      fork_(fork) {
  if (!env.pool) return;
  // Each region of the receive pool is registered with every device once, when it appears, and
  // stays registered until it is given back: a fetch into pool memory finds its registration in
  // the cache (a hit) and registers nothing. A region that cannot be registered is only logged:
  // a fetch into it registers its target itself, as for any other memory. A region of 1 MiB or
  // more is made inside a fetch, on a peer's strand, so it is registered on a registrar thread
  // (ferry/rdma/registrar.h); the caches know it is under way, and a fetch into it waits there
  // for its registration instead of making one of its own.
  pool_listener_ = env.pool->add_region_listener(
      [this](std::span<std::byte> region) {
        auto entry = std::make_shared<PoolRegion>();
        const auto register_all = [entry, devices = devices_, region](bool reserved) {
          std::vector<std::shared_ptr<Region>> registered;
          for (const auto& device : devices) {
            auto r = device->local_cache().acquire(region.data(), region.size(), region, reserved);
            if (r) {
              registered.push_back(std::move(r.value()));
            } else {
              FERRY_LOG_WARN("rdma: cannot register a receive pool region of {} bytes: {}",
                             region.size(), r.error().message());
            }
          }
          {
            std::lock_guard lock(entry->mu);
            entry->registered = std::move(registered);
            entry->done = true;
          }
          entry->done_cv.notify_all();
        };
        {
          std::lock_guard lock(mu_);
          pool_regions_[region.data()] = entry;
        }
        if (region.size() < kRegisterOnTheStrandBelow) return register_all(false);
        for (const auto& device : devices_) {
          device->local_cache().reserve(region.data(), region.size(), region);
        }
        submit_registration(region.size(), [register_all] { register_all(true); });
      },
      [this](std::span<std::byte> region) {
        std::shared_ptr<PoolRegion> entry;
        {
          std::lock_guard lock(mu_);
          auto it = pool_regions_.find(region.data());
          if (it == pool_regions_.end()) return;
          entry = std::move(it->second);
          pool_regions_.erase(it);
        }
        // Deregistered here, before the pool unmaps the region: a registration still under way
        // is waited for (registrations always return; bounded all the same).
        std::vector<std::shared_ptr<Region>> gone;
        std::unique_lock lock(entry->mu);
        if (!entry->done_cv.wait_for(lock, std::chrono::minutes(1), [&] { return entry->done; })) {
          FERRY_LOG_WARN(
              "rdma: a receive pool region is given back while its registration has "
              "not returned for a minute");
        }
        gone = std::move(entry->registered);
        lock.unlock();
      });
}

TransportInfo RdmaTransport::local_info() const {
  TransportInfo info;
  info.name = kTransportName;
  info.devices = {"cpu"};
  info.priority = 100;
  wire::Descriptor d;
  for (const auto& dev : devices_) {
    for (const auto& a : dev->addresses()) d.add_ips(a.ip);
  }
  info.descriptor = d.SerializeAsString();
  return info;
}

std::pair<std::shared_ptr<Device>, const Address*> RdmaTransport::local_address(
    const PeerInfo& peer) const {
  for (const auto& dev : devices_) {
    if (const Address* a = dev->find(peer.local_ip)) return {dev, a};
  }
  return {nullptr, nullptr};
}

bool RdmaTransport::peer_has_transport(const PeerInfo& peer) const {
  const TransportInfo* theirs = peer.find_transport(kTransportName);
  if (!theirs || !local_address(peer).second) return false;
  wire::Descriptor d;
  if (!d.ParseFromString(theirs->descriptor)) return false;
  for (const auto& ip : d.ips()) {
    if (ip == peer.remote_ip) return true;
  }
  return false;
}

// ---------------------------------------------------------------- queue pair setup

void RdmaTransport::async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) {
  // Once the peer's failed queue pairs are destroyed: one may still be placing data into the
  // targets of fetches that start again over the new pair.
  channel_options_.quiesce->when_quiet(*link, [this, link, done = std::move(done)]() mutable {
    open_channel(link, std::move(done));
  });
}

void RdmaTransport::when_quiet(PeerLink& link, std::function<void()> then) {
  channel_options_.quiesce->when_quiet(link, std::move(then));
}

void RdmaTransport::open_channel(const std::shared_ptr<PeerLink>& link, ChannelOpenHandler done) {
  auto [device, address] = local_address(link->info());
  if (!device) return done(make_error_code(errc::transport_unavailable), nullptr);
  auto channel = std::make_shared<RdmaChannel>(device, *address, link, channel_options_);
  if (auto ec = channel->init(/*serves=*/false)) {
    FERRY_LOG_WARN("rdma: cannot create a queue pair on {}: {}", device->name(), ec.message());
    return done(make_error_code(errc::device_error), nullptr);
  }
  auto timer =
      std::make_shared<asio::steady_timer>(link->strand().get_inner_executor(), open_timeout_);
  {
    std::lock_guard lock(mu_);
    opening_[link.get()] = PendingOpen{channel, std::move(done), timer};
    remember(channel);
  }
  timer->async_wait(asio::bind_executor(
      link->strand(), [this, weak = std::weak_ptr<PeerLink>(link)](boost::system::error_code ec) {
        auto l = weak.lock();
        if (!ec && l) on_accept(*l, nullptr, make_error_code(errc::handshake_failed));
      }));
  wire::Message m;
  *m.mutable_connect() = channel->local_info();
  send(*link, 0, m);
}

void RdmaTransport::on_connect(PeerLink& link, const wire::QpInfo& remote) {
  wire::Message reply;
  auto [device, address] = local_address(link.info());
  if (link.info().initiator || !device) {
    reply.set_refuse("no RDMA address for " + link.info().local_ip);
    return send(link, 0, reply);
  }
  // The initiator asks only when it has no working queue pair: any we still hold is stale.
  if (link.channel(kTransportName)) {
    link.drop_channel(kTransportName, make_error_code(errc::peer_closed));
  }
  auto channel =
      std::make_shared<RdmaChannel>(device, *address, link.shared_link(), channel_options_);
  std::error_code ec = channel->init(/*serves=*/true);
  if (!ec) ec = channel->connect(remote);
  if (ec || !link.install_channel(kTransportName, channel)) {
    FERRY_LOG_WARN("rdma: cannot set up a queue pair for peer '{}': {}", link.info().name,
                   ec ? ec.message() : "a channel exists already");
    channel->close(ec);
    reply.set_refuse("cannot set up a queue pair on " + device->name());
    return send(link, 0, reply);
  }
  {
    std::lock_guard lock(mu_);
    remember(channel);
  }
  *reply.mutable_accept() = channel->local_info();
  send(link, 0, reply);
}

void RdmaTransport::on_accept(PeerLink& link, const wire::QpInfo* remote, std::error_code ec) {
  PendingOpen pending;
  {
    std::lock_guard lock(mu_);
    auto it = opening_.find(&link);
    if (it == opening_.end()) return;
    pending = std::move(it->second);
    opening_.erase(it);
  }
  pending.timer->cancel();
  if (!ec && remote) ec = pending.channel->connect(*remote);
  if (ec) {
    pending.channel->close(ec);
    return pending.done(ec, nullptr);
  }
  pending.done({}, pending.channel);
}

void RdmaTransport::on_transport_message(PeerLink& link, uint64_t request_id,
                                         std::string_view payload) {
  // What the peer's channel (if any) did not take: queue pair setup, and messages for a channel
  // that is gone.
  wire::Message m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    FERRY_LOG_WARN("rdma: malformed control message from peer '{}'", link.info().name);
    return link.fail(make_error_code(errc::protocol_error));
  }
  switch (m.body_case()) {
    case wire::Message::kConnect:
      return on_connect(link, m.connect());
    case wire::Message::kAccept:
      return on_accept(link, &m.accept(), {});
    case wire::Message::kRefuse:
      FERRY_LOG_WARN("rdma: peer '{}' refused a queue pair: {}", link.info().name, m.refuse());
      return on_accept(link, nullptr, make_error_code(errc::transport_unavailable));
    case wire::Message::kRelease:
      // The lease ended with its channel; reads that succeeded still count as served.
      if (m.release()) link.settle(request_id);
      return;
    case wire::Message::kGrant:  // for a fetch that failed with its channel
    case wire::Message::kReset:  // of a queue pair this side has dropped already
      return;
    case wire::Message::BODY_NOT_SET:
      break;
  }
  FERRY_LOG_WARN("rdma: unknown control message from peer '{}'", link.info().name);
}

void RdmaTransport::garbage_collect(const StoredObject& object) {
  channel_options_.objects->release(object.id);
}

RegistrationCounters RdmaTransport::counters() const {
  RegistrationCounters total;
  for (const auto& dev : devices_) {
    for (const MrCache* cache : {&dev->remote_cache(), &dev->local_cache()}) {
      auto c = cache->counters();
      total.registrations += c.registrations;
      total.registration_ns += c.registration_ns;
      total.deregistrations += c.deregistrations;
      total.deregistration_ns += c.deregistration_ns;
      total.hits += c.hits;
      total.live += c.live;
    }
    const auto g = dev->grant_counters();
    total.registrations += g.registrations;
    total.registration_ns += g.registration_ns;
    total.deregistrations += g.registrations - g.live;
    total.deregistration_ns += g.deregistration_ns;
    total.live += g.live;
    total.windows += dev->windows_live();
    total.queue_pairs += dev->queue_pairs_live();
  }
  return total;
}

std::vector<TransportMetric> RdmaTransport::metrics() const {
  const auto c = counters();
  const auto n = [](uint64_t v) { return static_cast<double>(v); };
  size_t pool_regions = 0;
  {
    std::lock_guard lock(mu_);
    for (const auto& [at, entry] : pool_regions_) {
      std::lock_guard registered(entry->mu);
      pool_regions += entry->done && !entry->registered.empty();
    }
  }
  return {
      {"registrations_total", "memory registrations made (ibv_reg_mr).", false, n(c.registrations)},
      {"registration_seconds_total", "time spent registering memory.", false,
       static_cast<double>(c.registration_ns) * 1e-9},
      {"deregistrations_total", "memory registrations released.", false, n(c.deregistrations)},
      {"deregistration_seconds_total", "time spent releasing memory registrations.", false,
       static_cast<double>(c.deregistration_ns) * 1e-9},
      {"registration_hits_total", "buffers served by an existing registration.", false, n(c.hits)},
      {"registrations_live", "memory registrations held now.", true, n(c.live)},
      {"memory_windows", "memory windows allocated now (one per granted tensor while leased).",
       true, n(c.windows)},
      {"queue_pairs", "queue pairs now (one per connected peer).", true, n(c.queue_pairs)},
      {"pool_regions_registered", "receive pool regions registered with the devices now.", true,
       n(pool_regions)},
      {"fork_safe",
       "1 when a fork() of this process cannot corrupt its RDMA transfers (the kernel copies "
       "pinned pages, or libibverbs' fork protection is on), 0 when it can.",
       true, fork_ == ForkSafety::unprotected ? 0.0 : 1.0},
  };
}

void RdmaTransport::slow_registrations(std::chrono::milliseconds delay) {
  for (const auto& dev : devices_) dev->slow_registrations(delay);
}

void RdmaTransport::set_grant_tamper(GrantTamper tamper) {
  std::lock_guard lock(channel_options_.hooks->mu);
  channel_options_.hooks->armed = static_cast<bool>(tamper);
  channel_options_.hooks->tamper = std::move(tamper);
}

void RdmaTransport::remember(const std::shared_ptr<RdmaChannel>& channel) {
  // Pruned as it grows (an expired weak_ptr still holds its channel's allocation): a peer that
  // asks for queue pair after queue pair, or a server that sees client after client, does not
  // grow this list.
  if (channels_.size() >= 2 * live_channels_floor_) {
    std::erase_if(channels_, [](const auto& w) { return w.expired(); });
    live_channels_floor_ = std::max<size_t>(channels_.size(), 16);
  }
  channels_.push_back(channel);
}

size_t RdmaTransport::inject_queue_pair_errors() {
  std::vector<std::shared_ptr<RdmaChannel>> live;
  {
    std::lock_guard lock(mu_);
    std::erase_if(channels_, [](const auto& w) { return w.expired(); });
    for (const auto& w : channels_) {
      if (auto ch = w.lock()) live.push_back(std::move(ch));
    }
  }
  for (auto& ch : live) ch->post_inject_error();
  return live.size();
}

// ---------------------------------------------------------------- registration

bool register_rdma_transport() {
  static const bool registered = [] {
    auto ec = register_transport<RdmaOptions>(
        kTransportName, {"cpu"},
        [](const TransportEnv& env,
           const RdmaOptions& options) -> Result<std::shared_ptr<TransportManager>> {
          // Without a device libibverbs cannot learn from the kernel whether forks are safe:
          // nothing to settle, nor to warn about.
          if (!any_device()) return make_error_code(errc::device_error);
          // Before a device is opened (probing one may register buffers): protection, when
          // asked for, must come before the first registration.
          const ForkSafety fork = settle_fork_safety(options.fork_protection);
          auto devices = Device::open_all(options.grants, options.max_registration);
          if (devices.empty()) return make_error_code(errc::device_error);
          return std::shared_ptr<TransportManager>(
              std::make_shared<RdmaTransport>(env, options, std::move(devices), fork));
        },
        &RdmaOptions::from_environment);
    return !ec || ec == errc::transport_duplicate;
  }();
  return registered;
}

size_t inject_queue_pair_errors(Context& ctx) {
  auto t = std::dynamic_pointer_cast<RdmaTransport>(ctx.transport(kTransportName));
  return t ? t->inject_queue_pair_errors() : 0;
}

void set_grant_tamper(Context& ctx, GrantTamper tamper) {
  auto t = std::dynamic_pointer_cast<RdmaTransport>(ctx.transport(kTransportName));
  if (t) t->set_grant_tamper(std::move(tamper));
}

void lose_read_completions_after(Context& ctx, uint32_t reads) {
  auto t = std::dynamic_pointer_cast<RdmaTransport>(ctx.transport(kTransportName));
  if (t) t->hooks()->lose_after.store(reads, std::memory_order_release);
}

void slow_registrations(Context& ctx, std::chrono::milliseconds delay) {
  auto t = std::dynamic_pointer_cast<RdmaTransport>(ctx.transport(kTransportName));
  if (t) t->slow_registrations(delay);
}

std::optional<RegistrationCounters> registration_counters(Context& ctx) {
  auto t = std::dynamic_pointer_cast<RdmaTransport>(ctx.transport(kTransportName));
  if (!t) return std::nullopt;
  return t->counters();
}

}  // namespace ferry::rdma
