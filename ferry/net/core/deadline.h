// Timeouts as deadlines (internal): one bound for every timeout that becomes now + timeout.
#pragma once

#include <algorithm>
#include <chrono>

namespace ferry {

// `timeout`, at most 100 years: a timeout that long means "never", and a longer one would
// overflow the steady clock when added to now (and the margins added to that deadline after).
inline std::chrono::milliseconds bounded_timeout(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365 * 100)));
}

}  // namespace ferry
