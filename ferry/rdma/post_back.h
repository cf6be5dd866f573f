// post_back: how the RDMA transport's own threads (the registrar's, the reaper's) hand work back
// to a peer's strand (internal to the RDMA transport).
#pragma once

#include <functional>
#include <memory>

#include "ferry/net/loop_gate.h"
#include "ferry/net/transport.h"

namespace ferry::rdma {

// Posts `fn` to `link`'s strand through `gate` (straight without one). The post holds `link`,
// the session, which holds the context and its loop, and lets it go after `fn`: on the strand
// once `fn` has run, or here, `fn` first, when the gate refuses because the loop has run its
// last. The strand is copied only under the gate, while the loop surely exists. Any thread.
void post_back(const std::shared_ptr<LoopGate>& gate, std::shared_ptr<PeerLink> link,
               std::function<void()> fn);

}  // namespace ferry::rdma
