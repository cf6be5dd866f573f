// The reaper: destroys verbs objects on a background thread, in the order they were retired.
// Internal to rdma/.
//
// rxe's destroy calls can block for many seconds (ibv_destroy_qp waits until no packet of the
// queue pair is in flight or being retried, which for a peer that died takes its whole retry
// budget): they must never run on an io_context thread, where they would stall every peer of the
// context. Every verbs deleter (verbs.h) retires through here; one thread and one FIFO keep the
// order the objects were released in (windows before their registration, queue pairs before
// their completion queue, everything before its protection domain).
#pragma once

#include <chrono>
#include <functional>

namespace ferry::rdma {

// Queues `destroy` to run on the reaper thread (started on first use, never joined: at exit the
// kernel releases what is left). Any thread; never blocks.
void retire(std::function<void()> destroy);

// Waits until everything retired before the call has been destroyed, at most `timeout`; false
// on timeout. For tests and orderly shutdown.
bool drain_retired(std::chrono::milliseconds timeout);

}  // namespace ferry::rdma
