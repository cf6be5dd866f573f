// Exit codes of the ferry tool and the one way it reports a failure.
#pragma once

#include <string_view>
#include <system_error>

namespace ferry::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 1,         // bad arguments, unreadable input files
  kExitConnect = 2,       // cannot connect to the peer, or cannot listen
  kExitFetchFailed = 3,   // a fetch (or writing its output) failed
  kExitVerifyFailed = 4,  // received bytes differ from the manifest's checksums
  kExitTimeout = 5,       // a fetch or a request to the peer timed out
};

// The exit-code table, as shown at the end of --help.
extern const char* const kExitCodeHelp;

// Prints "ferry: <what>: <ec.message()>" to stderr and returns `code`.
int fail(ExitCode code, std::string_view what, const std::error_code& ec);
// Prints "ferry: <what>" to stderr and returns `code`.
int fail(ExitCode code, std::string_view what);

}  // namespace ferry::cli
