// `ferry fetch`: fetch objects from a peer, verify them, and summarize the run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/net/context.h"

namespace ferry::cli {

struct FetchArgs {
  std::string from;               // "" = the manifest's server, or the first ref's owner
  std::vector<std::string> refs;  // text form, "ferry1:..."
  std::string manifest;           // refs and checksums to verify against
  bool all = false;               // everything the peer's store holds
  int concurrency = 8;
  std::string window_bytes = "128M";  // bytes in flight or being checked (two go regardless)
  std::string out;                    // directory for <object_id>.<tensor_index>.bin files
  std::string transport = "auto";     // main sets the environment's (ContextOptions::transport)
  int64_t timeout_ms = 60000;         // per fetch
  bool json = false;
  std::string progress = "auto";  // auto | always | never
  bool quiet = false;
  int threads = 1;
};

// Connects, fetches every requested object with at most `concurrency` in flight and, beyond two,
// at most `window_bytes` of them in flight or being checked (each one's memory is released once
// it is verified and written, on the Checker's threads), and prints the summary. `options`: what
// its context starts from (main's ContextOptions::from_environment()). Returns the process exit
// code (see status.h).
int run_fetch(const FetchArgs& args, ContextOptions options);

}  // namespace ferry::cli
