// RdmaTransport: one-sided RDMA READ (internal; see ferry/rdma/rdma.h for the public part).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ferry/net/registry.h"
#include "ferry/net/transport.h"
#include "ferry/rdma/device.h"
#include "ferry/rdma/fork_safety.h"
#include "ferry/rdma/options.h"
#include "ferry/rdma/rdma.h"
#include "ferry/rdma/rdma_channel.h"

namespace ferry::rdma {

class RdmaTransport final : public TransportManager {
 public:
  // The core's timeouts from `env`, busy polling from `options`; `devices` opened with its grants;
  // `fork`: where the process stood (settle_fork_safety) before they were opened.
  RdmaTransport(const TransportEnv& env, const RdmaOptions& options,
                std::vector<std::shared_ptr<Device>> devices, ForkSafety fork);

  std::string name() const override { return kTransportName; }
  bool is_one_sided() const override { return true; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override;
  // Both sides have a RoCE v2 address on the metadata connection's IPs.
  bool peer_has_transport(const PeerInfo& peer) const override;

  void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) override;
  // Queue pair setup (connect, accept, refuse), and the release of a lease whose channel is gone.
  void on_transport_message(PeerLink& link, uint64_t request_id, std::string_view payload) override;
  void garbage_collect(const StoredObject& object) override;
  // Once the peer's failed and closed queue pairs that had READs posted are destroyed
  // (QuiesceBoard), or their bound has passed.
  void when_quiet(PeerLink& link, std::function<void()> then) override;

  RegistrationCounters counters() const;
  // counters() as ferry_rdma_* metrics.
  std::vector<TransportMetric> metrics() const override;
  size_t inject_queue_pair_errors();
  void set_grant_tamper(GrantTamper tamper);
  // See slow_registrations in ferry/rdma/rdma.h: on every device of this transport.
  void slow_registrations(std::chrono::milliseconds delay);
  // The hooks its channels share (lose_read_completions_after).
  const std::shared_ptr<Hooks>& hooks() const { return channel_options_.hooks; }

 private:
  struct PendingOpen {
    std::shared_ptr<RdmaChannel> channel;
    ChannelOpenHandler done;
    std::shared_ptr<boost::asio::steady_timer> timer;
  };

  // The device and address for the local IP of a peer's metadata connection.
  std::pair<std::shared_ptr<Device>, const Address*> local_address(const PeerInfo& peer) const;
  // async_open_channel once no failed queue pair of the peer is left to destroy. Strand.
  void open_channel(const std::shared_ptr<PeerLink>& link, ChannelOpenHandler done);
  void on_connect(PeerLink& link, const wire::QpInfo& remote);
  void on_accept(PeerLink& link, const wire::QpInfo* remote, std::error_code ec);

  std::vector<std::shared_ptr<Device>> devices_;
  ChannelOptions channel_options_;
  std::chrono::milliseconds open_timeout_;
  const ForkSafety fork_;

  mutable std::mutex mu_;
  std::unordered_map<const PeerLink*, PendingOpen> opening_;
  std::vector<std::weak_ptr<RdmaChannel>> channels_;  // for fault injection; under mu_
  size_t live_channels_floor_ = 16;  // channels_ is pruned when it reaches twice this; under mu_
  // Adds `channel` to channels_, dropping expired ones first when the list has doubled. mu_ held.
  void remember(const std::shared_ptr<RdmaChannel>& channel);
  // One receive pool region's registrations, one per device, made where the region appeared or
  // on a registrar thread (its jobs hold it).
  struct PoolRegion {
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;                                // under mu
    std::vector<std::shared_ptr<Region>> registered;  // under mu
  };
  // The receive pool's regions, registered on every device while the pool holds them; under mu_.
  std::unordered_map<const std::byte*, std::shared_ptr<PoolRegion>> pool_regions_;
  // Last: unregistered first, so no callback runs while the members above are destroyed.
  mem::RegionListener pool_listener_;
};

}  // namespace ferry::rdma
