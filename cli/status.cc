#include "cli/status.h"

#include <cstdio>
#include <string>

namespace ferry::cli {

const char* const kExitCodeHelp =
    "Exit status:\n"
    "  0  success\n"
    "  1  usage error (bad arguments, unreadable manifest or file)\n"
    "  2  cannot connect to the peer, or cannot listen\n"
    "  3  a fetch failed (or its output could not be written)\n"
    "  4  verification failed: received bytes differ from the manifest\n"
    "  5  timeout";

int fail(ExitCode code, std::string_view what, const std::error_code& ec) {
  std::fprintf(stderr, "ferry: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
               ec.message().c_str());
  return code;
}

int fail(ExitCode code, std::string_view what) {
  std::fprintf(stderr, "ferry: %.*s\n", static_cast<int>(what.size()), what.data());
  return code;
}

}  // namespace ferry::cli
