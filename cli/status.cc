#include "cli/status.h"

#include <cstdio>
#include <string>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "cli/pretty_json.h"
#include "ferry/net/errors.h"

namespace ferry::cli {

const char* const kExitCodeHelp =
    "Exit status:\n"
    "  0  success\n"
    "  1  usage error (bad arguments, unreadable manifest or file)\n"
    "  2  cannot connect to the peer, or cannot listen\n"
    "  3  a fetch failed (or its output could not be written)\n"
    "  4  verification failed: received bytes differ from the manifest\n"
    "  5  timeout";

namespace {

Failure& failure() {
  static Failure f;
  return f;
}

void remember(ExitCode code, std::string message, const std::error_code* ec) {
  auto& f = failure();
  if (f.exit_code != kExitOk) return;  // the first one is the cause; later ones follow from it
  f.exit_code = code;
  f.message = std::move(message);
  if (ec && *ec) {
    f.error_category = ec->category().name();
    f.error = ec->category() == ferry_category()
                  ? std::string(errc_name(static_cast<errc>(ec->value())))
                  : ec->message();
  }
}

}  // namespace

int fail(ExitCode code, std::string_view what, const std::error_code& ec) {
  std::fprintf(stderr, "ferry: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
               ec.message().c_str());
  remember(code, std::string(what) + ": " + ec.message(), &ec);
  return code;
}

int fail(ExitCode code, std::string_view what) {
  std::fprintf(stderr, "ferry: %.*s\n", static_cast<int>(what.size()), what.data());
  remember(code, std::string(what), nullptr);
  return code;
}

const Failure& first_failure() { return failure(); }

boost::json::value failure_value() {
  const auto& f = failure();
  if (f.exit_code == kExitOk) return nullptr;
  return boost::json::object{{"exit_code", f.exit_code},
                             {"message", f.message},
                             {"error", f.error},
                             {"category", f.error_category}};
}

std::string failure_json() { return pretty_json(boost::json::object{{"error", failure_value()}}); }

}  // namespace ferry::cli
