/// @file
/// The RDMA transport's public face: registration and counters. The transport itself
/// (one-sided RDMA READ over RC queue pairs, see docs/rdma.md) is internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

namespace ferry {
class Context;
}

/// The built-in RDMA transport's public face: registration, counters, fault injection, and
/// device discovery.
namespace ferry::rdma {

/// The name the RDMA transport registers under.
inline constexpr const char* kRdmaTransportName = "RDMA";

/// Registers "RDMA" with the process-wide registry, with its options (RdmaOptions and
/// RdmaOptions::from_environment, ferry/rdma/options.h), when this build has RDMA support (false
/// otherwise). Contexts then instantiate it when the machine has an active RoCE v2 device.
/// Idempotent.
bool register_rdma_transport();

/// Registrations include the per-grant ones of RdmaGrants::registrations (one per granted tensor
/// per grant, live while its lease is).
struct RegistrationCounters {
  uint64_t registrations = 0;      ///< ibv_reg_mr calls
  uint64_t registration_ns = 0;    ///< time spent in them
  uint64_t deregistrations = 0;    ///< registrations released
  uint64_t deregistration_ns = 0;  ///< time spent releasing them
  uint64_t hits = 0;               ///< buffers served by an existing registration
  uint64_t live = 0;               ///< registrations now
  uint64_t windows = 0;      ///< memory windows allocated now (one per granted tensor while leased)
  uint64_t queue_pairs = 0;  ///< queue pairs that exist now (one per connected peer)
};

/// Summed over the devices of `ctx`'s RDMA transport; nullopt when it has none. Gauges for leak
/// checks (live, windows, queue_pairs) and counters of work done.
std::optional<RegistrationCounters> registration_counters(Context& ctx);

/// Fault injection (tests, soak runs): moves every queue pair of `ctx`'s RDMA transport to the
/// error state, as a broken link eventually does. Their in-flight READs complete with flush
/// errors, their fetches fail with a peer-scope error, and the next fetch to each peer sets up a
/// new queue pair. Returns how many queue pairs it broke. Asynchronous.
size_t inject_queue_pair_errors(Context& ctx);

/// Fault injection (tests): forges what `ctx`'s fetches READ. Called on the fetcher's strand for
/// each extent of each grant that one rkey opens (a segment, or each piece of a segment the owner
/// registered in pieces), before any READ is posted, with its address and rkey (which it may
/// rewrite) and its length. Returning false holds the fetch: no READ
/// is posted, and it ends by its deadline or an abort, like a fetcher that never reads. An empty
/// function turns it off. Used to show that forged, expired and other peers' grants are refused.
using GrantTamper = std::function<bool(uint64_t& addr, uint32_t& rkey, uint64_t length)>;
/// Installs `tamper` (see GrantTamper) on `ctx`'s RDMA transport, for the grants its fetches use
/// from now on; an empty function removes it. Does nothing when `ctx` has no RDMA transport. Any
/// thread.
void set_grant_tamper(Context& ctx, GrantTamper tamper);

/// Fault injection (tests): the next queue pair of `ctx`'s RDMA transport to complete `reads`
/// more READs loses the completions of every READ after those, as rxe has been seen to under
/// load: the pair goes on working and its data lands, but those READs never complete. Once, for
/// one pair; does nothing when `ctx` has no RDMA transport. Any thread.
void lose_read_completions_after(Context& ctx, uint32_t reads);

/// Fault injection (tests): every memory registration `ctx`'s RDMA transport makes from now on
/// (for a fetch's targets, a serve, a grant or the receive pool) takes `delay` longer, on the
/// thread that makes it, as registering many GiB does: its memory counts as being registered
/// meanwhile. Zero turns it off. Does nothing when `ctx` has no RDMA transport. Any thread.
void slow_registrations(Context& ctx, std::chrono::milliseconds delay);

}  // namespace ferry::rdma
