/// @file
/// CmaTransport: one-sided transfers between processes on one host. The fetcher copies the
/// object's bytes straight out of the owner's memory into its targets (cross-memory attach:
/// process_vm_readv), one copy and no socket for the bytes; the owner's CPU only answers the
/// request and keeps the object pinned until the fetcher's release. It needs what the kernel
/// asks of a reader (the same user, and kernel.yama.ptrace_scope 0, or root): a channel proves
/// it with one read when it opens and is refused otherwise, so fetches use another transport.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ferry/cma/options.h"
#include "ferry/net/registry.h"
#include "ferry/net/transport.h"

/// The built-in same-host transport (cross-memory attach).
namespace ferry::cma {

/// The name CmaTransport registers under.
inline constexpr const char* kTransportName = "CMA";

class Copier;
class LeaseBoard;
class CmaChannel;
namespace wire {
class Open;
}

/// The CMA transport (see this file's comment): one-sided, aborts between copy steps, chosen by
/// "auto" only when CmaOptions::preferred. Contexts make one each through the registry
/// (register_cma_transport); applications do not construct it. The TransportManager contract
/// holds for every method.
class CmaTransport final : public TransportManager {
 public:
  /// Takes the copy step and the preference from `options`, the channel handshake's deadline
  /// from `env.options.handshake_timeout`.
  CmaTransport(const TransportEnv& env, const CmaOptions& options);
  ~CmaTransport() override;

  /// Advertises this host's identity and this process's id; priority 50 (between RDMA and TCP)
  /// when preferred, else 1 (below TCP: used when asked for by name).
  TransportInfo local_info() const override;
  /// True when the peer advertised CMA from this host (the same boot and pid namespace) and this
  /// process was not refused its memory on that connection before.
  bool peer_has_transport(const PeerInfo& peer) const override;

  /// Asks the peer for a channel and reads one word of its memory to prove that the kernel lets
  /// this process do so: transport_unavailable (logged) when it does not or the peer refuses,
  /// handshake_failed when no answer comes within the handshake timeout. (The peer reads one of
  /// ours likewise, for its own fetches from this side.)
  void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) override;
  /// The channel set-up messages: a peer's request (acceptor side: installs the channel) and the
  /// answer to ours. Malformed input fails the peer with protocol_error.
  void on_transport_message(PeerLink& link, uint64_t request_id, std::string_view payload) override;
  /// Bytes copied, fetches completed, channels refused because reads were not permitted.
  std::vector<TransportMetric> metrics() const override;
  /// CMA holds nothing per object: the pin of each grant is what keeps its memory.
  void garbage_collect(const StoredObject& object) override;

  std::string name() const override { return kTransportName; }
  bool is_one_sided() const override { return true; }  ///< the fetcher reads
  bool can_abort() const override { return true; }     ///< between copy steps
  bool reaches_other_hosts() const override { return false; }

  /// Shared with the channels: what metrics() reports.
  struct Counters;

 private:
  struct Opening;
  // A channel to the process `pid` (the copier is made with the first).
  std::shared_ptr<CmaChannel> make_channel(PeerLink& link, pid_t pid);
  // This side as an open or welcome message describes it (host, pid, the probe word).
  void describe(wire::Open& open) const;
  // Reads the probe word `theirs` names in process `pid`: the kernel's refusal (then counted,
  // and this session's peer is no longer offered CMA by peer_has_transport), a word that is not
  // the one announced (protocol_error), or success.
  std::error_code probe(PeerLink& link, pid_t pid, const wire::Open& theirs);

  TransportInfo info_;
  std::string host_;
  std::chrono::milliseconds open_timeout_;
  size_t copy_step_;
  size_t inline_bytes_;
  std::chrono::milliseconds lease_timeout_;
  unsigned copy_threads_;
  std::shared_ptr<Counters> counters_;
  std::shared_ptr<LeaseBoard> board_;  // the lease words of our grants, shared by the channels
  // The word a peer reads to prove it may (its address and value go in open and welcome).
  uint64_t probe_value_;
  mutable std::mutex mu_;
  std::map<const PeerLink*, std::shared_ptr<Opening>> opening_;
  std::shared_ptr<Copier> copier_;  // made with the first channel (mu_)
  // Sessions (PeerInfo::session_id) whose peer this process may not read: never tried again.
  std::set<uint64_t> unreadable_;
};

/// Registers "CMA" with the process-wide registry, with its options (CmaOptions and
/// CmaOptions::from_environment). Idempotent; returns true once registered.
bool register_cma_transport();

}  // namespace ferry::cma
