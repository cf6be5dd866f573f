#include "cli/status.h"

#include <cstdio>
#include <string>

#include "cli/json.h"
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

void write_failure(JsonWriter& w) {
  const auto& f = failure();
  w.key("error");
  if (f.exit_code == kExitOk) {
    w.null();
    return;
  }
  w.begin_object().key("exit_code").value(static_cast<uint64_t>(f.exit_code));
  w.key("message").value(f.message);
  w.key("error").value(f.error).key("category").value(f.error_category).end_object();
}

std::string failure_json() {
  JsonWriter w;
  w.begin_object();
  write_failure(w);
  w.end_object();
  return w.str();
}

}  // namespace ferry::cli
