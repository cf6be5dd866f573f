// `ferry info`: what this build of ferry can do on this machine.
#pragma once

namespace ferry::cli {

// Prints the version, the registered transports, the transports a default Context instantiates
// and the RDMA devices, as text or (with `json`) as a JSON document. Returns the exit code.
int run_info(bool json);

}  // namespace ferry::cli
