// Built instead of the transport when this build has no RDMA support.
#include "ferry/rdma/rdma.h"

namespace ferry::rdma {

bool register_rdma_transport() { return false; }

std::optional<RegistrationCounters> registration_counters(Context&) { return std::nullopt; }

size_t inject_queue_pair_errors(Context&) { return 0; }

void set_grant_tamper(Context&, GrantTamper) {}
void lose_read_completions_after(Context&, uint32_t) {}
void slow_registrations(Context&, std::chrono::milliseconds) {}

}  // namespace ferry::rdma
