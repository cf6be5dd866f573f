// Exit codes of the ferry tool and the one way it reports a failure.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include <boost/json/fwd.hpp>

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

// Prints "ferry: <what>: <ec.message()>" to stderr, remembers it (last_failure) and returns
// `code`.
int fail(ExitCode code, std::string_view what, const std::error_code& ec);
// Prints "ferry: <what>" to stderr, remembers it and returns `code`.
int fail(ExitCode code, std::string_view what);

// The first failure fail() reported in this process (code kExitOk and no text: none), for --json
// output, which carries it. The error's code and category when it had one. Main thread.
struct Failure {
  int exit_code = kExitOk;
  std::string message;  // as printed, without the "ferry: " prefix
  std::string error;    // the error's name (errc_name, or the category's message), or ""
  std::string error_category;
};
const Failure& first_failure();

// first_failure() as the "error" member of a --json document: {"exit_code", "message", "error",
// "category"}, or null when there was none.
boost::json::value failure_value();
// A JSON document holding only that "error" member: what a --json subcommand prints when it
// fails before it has anything else to say.
std::string failure_json();

}  // namespace ferry::cli
