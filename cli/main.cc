// ferry: the command-line tool. This file only wires the subcommands to their runners.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/collective.h"
#include "cli/fetch.h"
#include "cli/info.h"
#include "cli/serve.h"
#include "cli/status.h"
#include "cli/units.h"
#include "cli/workload.h"
#include "ferry/ferry.h"
#include "ferry/net/log.h"

namespace ferry::cli {
namespace {

// CLI11 checks: "" when `text` is valid, else what is wrong with it.
std::string check_size(const std::string& text) {
  return parse_size(text) ? "" : "expected a size such as 4096, 64K, 1.5M or 1G";
}
std::string check_size_range(const std::string& text) {
  return parse_range(text, parse_size) ? "" : "expected MIN-MAX sizes such as 4K-64M";
}
std::string check_count_range(const std::string& text) {
  auto range = parse_range(text, parse_count);
  return range && range->first >= 1 && range->second <= kMaxTensorsPerObject
             ? ""
             : "expected MIN-MAX counts from 1 to " + std::to_string(kMaxTensorsPerObject) +
                   ", such as 1-3";
}
std::string check_object_count(const std::string& text) {
  auto n = parse_count(text);
  return n && *n <= kMaxObjects
             ? ""
             : "expected a whole number from 0 to " + std::to_string(kMaxObjects);
}

std::vector<std::string> transport_choices() {
  std::vector<std::string> names{"auto"};
  for (const auto& t : registered_transports()) names.push_back(t.name);
  return names;
}

// --transport NAME: "auto" or a registered transport's name, in any case.
void add_transport_option(CLI::App* cmd, std::string& transport, const std::string& help) {
  cmd->add_option("--transport", transport, help)
      ->type_name("NAME")
      ->transform(CLI::IsMember(transport_choices(), CLI::ignore_case))
      ->capture_default_str();
}

// --threads N: the threads running the subcommand's Context, 1 to 256.
void add_threads_option(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads, "Threads running the context")
      ->type_name("N")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
}

// The subcommand's help ends with `text`, then the exit codes every subcommand shares.
void set_footer(CLI::App* cmd, const std::string& text) { cmd->footer(text + kExitCodeHelp); }

void add_serve(CLI::App& app, ServeArgs& a) {
  auto* cmd = app.add_subcommand("serve", "Put objects into a store and serve them to peers");
  cmd->add_option("--listen", a.listen, "Address to listen on; port 0 picks a free port")
      ->type_name("IP:PORT")
      ->capture_default_str();
  cmd->add_option("--objects", a.objects, "Number of random objects")
      ->type_name("N")
      ->check(check_object_count);
  cmd->add_option("--tensors", a.tensors, "Tensors per random object")
      ->type_name("MIN-MAX")
      ->check(check_count_range)
      ->capture_default_str();
  cmd->add_option("--sizes", a.sizes, "Tensor sizes, log-uniform (suffixes K, M, G)")
      ->type_name("MIN-MAX")
      ->check(check_size_range)
      ->capture_default_str();
  cmd->add_option("--total", a.total, "Scale random tensors up until they total at least SIZE")
      ->type_name("SIZE")
      ->check(check_size);
  cmd->add_option("--seed", a.seed, "Seed of the random objects")->capture_default_str();
  cmd->add_option("--file", a.files, "Serve a file's bytes as one object (repeatable)")
      ->type_name("PATH")
      ->allow_extra_args(false)
      ->check(CLI::ExistingFile.description(""));
  cmd->add_option("--manifest", a.manifest, "Write refs and checksums to FILE (JSON)")
      ->type_name("FILE");
  cmd->add_flag("--json", a.json, "Print the objects as a JSON document");
  cmd->add_option("--metrics", a.metrics,
                  "Serve Prometheus metrics (Context::stats) at http://IP:PORT/metrics")
      ->type_name("IP:PORT");
  cmd->add_option("--duration", a.duration, "Stop after SECONDS (default: on SIGINT/SIGTERM)")
      ->type_name("SECONDS")
      ->check([](const std::string& text) -> std::string {
        // 0 to 1e9 s (31 years): past what the clock holds (or NaN) it ended at once before.
        double seconds = -1;
        try {
          seconds = std::stod(text);
        } catch (const std::exception&) {
        }
        return seconds >= 0 && seconds <= 1e9 ? "" : "SECONDS must be a number from 0 to 1e9";
      });
  add_threads_option(cmd, a.threads);
  set_footer(cmd,
             "Puts random objects (--objects) and/or files (--file) into a ferry store and\n"
             "serves them until SIGINT/SIGTERM or --duration. Prints one line per object\n"
             "(`REF BYTES CHECKSUMS`), then `ready ADDRESS` once peers can connect; with\n"
             "--json, one JSON document on stdout and the ready line on stderr.\n\n");
}

void add_fetch(CLI::App& app, FetchArgs& a) {
  auto* cmd = app.add_subcommand("fetch", "Fetch objects from a peer and verify them");
  cmd->add_option("--from", a.from, "Peer to fetch from (default: the manifest's server)")
      ->type_name("HOST:PORT");
  auto* refs = cmd->add_option("refs", a.refs, "Refs to fetch (ferry1:...)")->type_name("REF");
  auto* manifest =
      cmd->add_option("--manifest", a.manifest, "Fetch and verify a manifest's objects")
          ->type_name("FILE")
          ->check(CLI::ExistingFile.description(""));
  auto* all = cmd->add_flag("--all", a.all, "Fetch every object the peer's store holds");
  refs->excludes(manifest);
  all->excludes(refs);
  all->excludes(manifest);
  cmd->add_option("--concurrency", a.concurrency, "Fetches in flight")
      ->type_name("N")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option(
         "--window-bytes", a.window_bytes,
         "Bytes of objects in flight or being checked at most; two objects are always in flight")
      ->type_name("SIZE")
      ->check(check_size)
      ->capture_default_str();
  cmd->add_option("--out", a.out, "Write tensors to DIR/<object_id>.<tensor_index>.bin")
      ->type_name("DIR");
  add_transport_option(cmd, a.transport,
                       "Transport to use: auto (the best both sides reach), or a name; default "
                       "from $FERRY_TRANSPORT");
  cmd->add_option("--timeout", a.timeout_ms, "Deadline of each fetch")
      ->type_name("MS")
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}))
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "Print the summary as JSON");
  cmd->add_option("--progress", a.progress, "Progress on stderr (auto: a bar on a terminal)")
      ->type_name("WHEN")
      ->transform(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", a.quiet, "No progress and no table (errors still go to stderr)");
  add_threads_option(cmd, a.threads);
  set_footer(cmd,
             "Fetches the refs given, a manifest's objects (verifying every byte against its\n"
             "checksums) or everything the peer holds (--all), at most --concurrency and\n"
             "--window-bytes at a time, then prints a summary: bytes, throughput, fetch\n"
             "latency, verification.\n\n");
}

void add_collective(CLI::App& app, CollectiveArgs& a) {
  auto* cmd = app.add_subcommand("collective", "Run every collective on N local processes");
  cmd->add_option("-n,--ranks", a.ranks, "Processes (ranks) to start")
      ->type_name("N")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--sizes", a.sizes, "Tensor sizes (suffixes K, M, G), comma-separated")
      ->type_name("SIZE,...")
      ->delimiter(',')
      ->check(check_size)
      ->capture_default_str();
  cmd->add_option("--iterations", a.iterations, "Timed allreduces per size")
      ->type_name("N")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  cmd->add_option("--host", a.host, "Address every rank listens on")->capture_default_str();
  add_transport_option(cmd, a.transport, "Transport the ranks use: auto, or a name");
  cmd->add_option("--timeout", a.timeout_s, "Bound on the whole run; ranks left are killed")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "Print the results as one JSON document");
  set_footer(cmd,
             "Forks --ranks processes that form a group and run, at each size: allreduce\n"
             "(float32 and int64 sums, exact), broadcast from every root, allgather and\n"
             "reduce-scatter, each verified on every rank against a reference; then times\n"
             "--iterations allreduces (median, algorithm and bus bandwidth as NCCL's tests\n"
             "define them). Exits 0 only if every rank verified everything.\n\n");
}

int run(int argc, char** argv) {
  CLI::App app("ferry " + std::string(kVersion) +
                   ": asynchronous tensor and buffer transfers between processes",
               "ferry");
  app.set_version_flag("--version", "ferry " + std::string(kVersion));
  app.require_subcommand(1);
  app.footer(kExitCodeHelp);
  // The one place the tool reads ferry's $FERRY_* variables; every context starts from these.
  const ContextOptions environment = ContextOptions::from_environment();
  ServeArgs serve_args;
  FetchArgs fetch_args;
  fetch_args.transport = environment.transport;
  bool info_json = false;
  add_serve(app, serve_args);
  add_fetch(app, fetch_args);
  CollectiveArgs collective_args;
  add_collective(app, collective_args);
  auto* info =
      app.add_subcommand("info", "Show the version, transports, RDMA devices and the receive pool");
  info->add_flag("--json", info_json, "Print as JSON");
  info->footer(kExitCodeHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (app.got_subcommand("serve")) return run_serve(serve_args, environment);
  if (app.got_subcommand("fetch")) return run_fetch(fetch_args, environment);
  if (app.got_subcommand("collective")) return run_collective(collective_args, environment);
  return run_info(info_json, environment);
}

}  // namespace
}  // namespace ferry::cli

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout or socket is an error code, not a death
  // The runners report their failures themselves; what reaches here is a bug or an exhausted
  // machine, said in words (the library's text goes to the log, for a bug report).
  try {
    return ferry::cli::run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ferry: out of memory\n");
  } catch (const std::exception& e) {
    FERRY_LOG_DEBUG("unexpected exception: {}", e.what());
    std::fprintf(stderr,
                 "ferry: unexpected internal error (FERRY_LOG=debug shows it; please report "
                 "it)\n");
  }
  return ferry::cli::kExitUsage;
}
