// `ferry info`: what this build of ferry can do on this machine.
#pragma once

#include "ferry/net/context.h"

namespace ferry::cli {

// Prints the version, the registered transports, the transports a default Context instantiates
// (one made with `options`: main's ContextOptions::from_environment()), the RDMA devices and the
// settings the environment gave it, as text or (with `json`) as a JSON document. Returns the
// exit code.
int run_info(bool json, ContextOptions options);

}  // namespace ferry::cli
