/// @file
/// RdmaOptions: the RDMA transport's own settings. A Context carries them to the transport in
/// ContextOptions::transport_options under "RDMA" (rdma::kRdmaTransportName).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

namespace ferry::rdma {

/// What an RDMA grant (the rkey an owner sends a fetcher) opens. Both per-peer modes give a grant
/// to one peer (its queue pair), over exactly the granted range, for one lease: another peer's,
/// an expired, a forged or an out-of-range rkey gets a remote access error (docs/security.md).
enum class RdmaGrants {
  /// windows on devices that have type-2 memory windows and are not soft-RoCE; registrations
  /// elsewhere (rxe's windows stall READs under load and are not range-checked).
  automatic,
  /// Owner memory is registered once, without remote access; each grant binds a type-2 window
  /// over the range to the fetcher's queue pair (one bind work request per tensor). A device
  /// without windows uses registrations instead (logged).
  windows,
  /// Each peer's queue pair has its own protection domain; each grant registers exactly the
  /// range there (one ibv_reg_mr per tensor per grant, deregistered when the lease ends).
  registrations,
  /// Weaker, for speed: owner memory is registered once with remote read access and its rkey is
  /// valid for every peer, over the whole registration, until the object is collected (logged).
  regions,
};

/// "auto", "windows", "registrations", "regions"; nullopt for anything else.
std::optional<RdmaGrants> parse_rdma_grants(std::string_view text);
/// The name parse_rdma_grants() reads for `grants` ("auto" for automatic).
const char* rdma_grants_name(RdmaGrants grants);

/// What the RDMA transport of one Context is configured with. Set it with
/// `options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName)`; a context with
/// no entry uses these defaults.
struct RdmaOptions {
  /// How one-sided grants open owner memory to a peer (see RdmaGrants).
  RdmaGrants grants = RdmaGrants::automatic;
  /// Poll the completion queue instead of sleeping on its channel.
  bool busy_poll = false;
  /// How long a queue pair that failed or closed with READs posted may take to be destroyed
  /// before the fetches it ended complete and a new pair to its peer is set up without waiting
  /// any longer (logged when it passes). Until the pair is destroyed the device may still place
  /// READ responses into those fetches' targets; a destroy that takes longer is rxe's, retrying
  /// packets of a dead peer.
  std::chrono::milliseconds quiesce_timeout{5000};
  /// The most bytes one memory registration covers; larger memory (an owner's object, a
  /// fetcher's target, a receive pool region) is registered in chunks of it, and READs never
  /// cross a chunk. 0: the device's own limit (its max_mr_size; 256 MiB on soft-RoCE, which
  /// advertises none but refuses a registration over 1 GiB). Rounded up to whole pages.
  /// $FERRY_RDMA_MAX_REGISTRATION sets it (a byte count: "268435456", "256M").
  size_t max_registration = 0;
  /// On a kernel that does not copy pinned pages at fork() (libibverbs' ibv_is_fork_initialized()
  /// says IBV_FORK_DISABLED; on kernels that copy them it says IBV_FORK_UNNEEDED), a fork of the
  /// process can corrupt its RDMA transfers silently (docs/rdma.md, "fork()"). true: turn
  /// libibverbs' protection on (ibv_fork_init()) when the transport starts, before it registers
  /// anything: children then have no mapping of registered memory, and each registration costs a
  /// madvise. false: leave it as the process has it (RDMAV_FORK_SAFE) and warn once when forks
  /// are unsafe. The protection is process-wide and cannot be turned off again.
  /// $FERRY_RDMA_FORK_PROTECTION=1 sets it (env_flag's values).
  bool fork_protection = false;

  /// The defaults with what the environment sets: `grants` from $FERRY_RDMA_GRANTS
  /// (parse_rdma_grants(); a value that is not a mode is logged and automatic kept),
  /// `max_registration` from $FERRY_RDMA_MAX_REGISTRATION (mem::parse_byte_count(); a value that
  /// is not a byte count is logged and 0 kept) and `fork_protection` from
  /// $FERRY_RDMA_FORK_PROTECTION ("1", "true" or "yes"; "0", "false" or "no"; anything else is
  /// logged and false kept).
  /// ContextOptions::from_environment() calls it (the transport registers it).
  static RdmaOptions from_environment();
};

}  // namespace ferry::rdma
