#include "cli/fetch.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>

#include "cli/checker.h"
#include "cli/manifest.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/status.h"
#include "cli/units.h"
#include "ferry/ferry.h"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

// One object to fetch, and what it must contain when a manifest says so.
struct Target {
  ObjectRef ref;
  std::string text;
  const ManifestObject* expected = nullptr;
};

// A fetch that ended, or an object the Checker has checked.
struct Completion {
  enum Kind { kFetched, kChecked } kind = kFetched;
  size_t index = 0;
  std::error_code ec;
  FetchResult result;
  std::chrono::nanoseconds latency{0};
  Checked checked;  // kChecked
};

// Completed fetches and checks, handed from ferry's and the Checker's threads to the main
// thread.
class CompletionQueue {
 public:
  // Adds a completion and wakes the waiter. Any thread.
  void push(Completion c) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(c));
    }
    cv_.notify_one();
  }
  // The oldest completion, waiting at most `timeout`; nullopt when none arrived in time.
  std::optional<Completion> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !items_.empty(); })) return std::nullopt;
    Completion c = std::move(items_.front());
    items_.pop_front();
    return c;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Completion> items_;
};

std::string describe(const Target& t) {
  return "object " + std::to_string(t.ref.object_id) + " (" + t.text.substr(0, 24) + "...)";
}

// Fills `targets` from the refs on the command line or from the manifest. Returns an exit code.
int collect_targets(const FetchArgs& args, const Manifest& manifest, std::vector<Target>& targets) {
  for (const auto& text : args.refs) {
    auto ref = ObjectRef::from_string(text);
    if (!ref) return fail(kExitUsage, "'" + text + "' is not a ferry ref", ref.error());
    targets.push_back({std::move(*ref), text, nullptr});
  }
  for (size_t i = 0; i < manifest.objects.size(); ++i) {
    const auto& object = manifest.objects[i];
    auto ref = ObjectRef::from_string(object.ref);
    if (!ref) {
      return fail(kExitUsage,
                  "manifest " + args.manifest + ": object " + std::to_string(i) + ": bad ref",
                  ref.error());
    }
    targets.push_back({std::move(*ref), object.ref, &object});
  }
  return kExitOk;
}

// The peer to fetch from: --from, else the manifest's server, else the first ref's owner.
std::string peer_address(const FetchArgs& args, const Manifest& manifest,
                         const std::vector<Target>& targets) {
  if (!args.from.empty()) return args.from;
  if (!manifest.server.empty()) return manifest.server;
  return targets.empty() ? "" : targets.front().ref.owner;
}

// Reports what checking one object found (Checker). Returns an exit code; a verification
// failure is reported and counted, not returned.
int report_checked(const Target& target, const Checked& checked, FetchSummary& summary,
                   Progress& progress) {
  if (!checked.mismatch.empty()) {
    progress.clear();
    fail(kExitVerifyFailed, "verify " + describe(target) + ": " + checked.mismatch);
    ++summary.mismatched;
  }
  if (!checked.write_error.empty()) {
    progress.clear();
    return fail(kExitFetchFailed, checked.write_error);
  }
  return kExitOk;
}

// Fetches every target with at most `args.concurrency` in flight and at most `args.window_bytes`
// of objects in flight or being checked, and so at most that much in memory (an object's bytes
// count until it has been verified, written and released), except that two in flight always
// go while no more objects wait for their checks than the Checker has threads: memory is then
// bounded by the window and a few objects. Objects are checked on the Checker's threads while
// the next fetches go out; two in flight keep the peer busy (a peer serves a window oldest
// first, so more large ones only wait, holding their memory). Fills `summary`; returns an exit
// code, stopping at the first failed fetch.
int fetch_targets(const FetchArgs& args, Peer& peer, const std::vector<Target>& targets,
                  FetchSummary& summary) {
  FetchOptions options;
  if (args.transport != "auto") options.transport = args.transport;
  options.timeout = std::chrono::milliseconds(args.timeout_ms);
  uint64_t total_bytes = 0;
  for (const auto& t : targets) total_bytes += t.ref.metadata.total_bytes();
  Progress progress(args.quiet ? ProgressMode::kNever : parse_progress_mode(args.progress),
                    targets.size(), total_bytes);
  auto queue = std::make_shared<CompletionQueue>();  // outlives late completions
  std::map<size_t, FetchRequest> running;            // by target index: their bytes so far
  auto issue = [&](size_t i) {
    running[i] = peer.fetch(
        targets[i].ref, {}, options,
        FetchHandler(
            [queue, i, issued = Clock::now()](boost::system::error_code ec, FetchResult result) {
              queue->push({Completion::kFetched, i, ec, std::move(result), Clock::now() - issued});
            }));
  };
  // What has landed: the objects done, and the bytes of those in flight so far.
  auto landed = [&] {
    uint64_t bytes = summary.bytes;
    for (const auto& [i, request] : running) bytes += request.bytes_landed();
    return bytes;
  };
  const bool checks =
      !args.out.empty() || std::any_of(targets.begin(), targets.end(),
                                       [](const Target& t) { return t.expected != nullptr; });
  // Its destructor, as this returns, runs the checks still queued after an error.
  std::optional<Checker> checker;
  const size_t checkers = checks ? Checker::default_threads() : 0;
  if (checks) checker.emplace(checkers, args.out);

  const auto start = Clock::now();
  const auto window = static_cast<size_t>(args.concurrency);
  const uint64_t window_bytes = parse_size(args.window_bytes).value_or(UINT64_MAX);
  const auto size_of = [&](size_t i) { return targets[i].ref.metadata.total_bytes(); };
  size_t next = 0, in_flight = 0, checking = 0;
  uint64_t bytes_held = 0;  // of the objects in flight and of those being checked
  const auto may_issue = [&] {
    return next < targets.size() && in_flight < window &&
           ((in_flight < 2 && checking <= checkers) || bytes_held + size_of(next) <= window_bytes);
  };
  int rc = kExitOk;
  while (rc == kExitOk && (next < targets.size() || in_flight > 0 || checking > 0)) {
    for (; may_issue(); ++next, ++in_flight) {
      bytes_held += size_of(next);
      issue(next);
    }
    // Each fetch has its own deadline; this bound only guards against a lost completion. The
    // progress moves meanwhile, with the bytes of the fetches in flight.
    const auto give_up = Clock::now() + options.timeout + std::chrono::seconds(5);
    std::optional<Completion> done;
    while (!(done = queue->pop(std::chrono::milliseconds(100))) && Clock::now() < give_up) {
      progress.update(summary.objects, landed());
    }
    if (!done) {
      progress.clear();
      rc = fail(kExitTimeout,
                "no fetch completed within " + std::to_string(args.timeout_ms + 5000) + " ms");
      break;
    }
    const size_t i = done->index;
    if (done->kind == Completion::kChecked) {
      --checking;
      bytes_held -= size_of(i);
      rc = report_checked(targets[i], done->checked, summary, progress);
      continue;
    }
    --in_flight;
    running.erase(i);
    if (done->ec) {
      progress.clear();
      rc = fail(done->ec == errc::timed_out ? kExitTimeout : kExitFetchFailed,
                "fetch " + describe(targets[i]), done->ec);
      break;
    }
    summary.objects += 1;
    summary.tensors += done->result.tensors.size();
    summary.bytes += done->result.bytes;
    summary.latencies.push_back(done->latency);
    progress.update(summary.objects, landed());
    if (!checker) {
      bytes_held -= size_of(i);  // `done` releases the object's memory
      continue;
    }
    ++checking;
    checker->submit(std::move(done->result), targets[i].expected, [queue, i](Checked c) {
      queue->push({Completion::kChecked, i, {}, {}, {}, std::move(c)});
    });
  }
  summary.wall = Clock::now() - start;
  progress.finish();
  return rc;
}

// Everything run_fetch does but print the result: fills `summary` with what completed, also when
// it fails (fail() has reported why). Returns an exit code.
int fetch_all(const FetchArgs& args, ContextOptions options, FetchSummary& summary,
              std::string& from_out) {
  Manifest manifest;
  if (std::string error; !args.manifest.empty() && !read_manifest(args.manifest, manifest, error)) {
    return fail(kExitUsage, "manifest " + args.manifest + ": " + error);
  }
  std::vector<Target> targets;
  if (int rc = collect_targets(args, manifest, targets)) return rc;
  if (targets.empty() && args.manifest.empty() && !args.all) {
    return fail(kExitUsage, "nothing to fetch: give REF..., --manifest FILE or --all");
  }
  const std::string from = peer_address(args, manifest, targets);
  from_out = from;
  if (from.empty()) return fail(kExitUsage, "no peer to fetch from: give --from HOST:PORT");
  if (!args.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(args.out, ec);
    if (ec) return fail(kExitFetchFailed, "create directory " + args.out, ec);
  }

  options.name = "ferry-fetch";
  options.threads = args.threads;
  options.transport = args.transport;
  auto ctx = Context::create(options);
  if (!ctx) return fail(kExitUsage, "create context", ctx.error());
  auto connected = (*ctx)->connect(from);
  if (connected.error() == errc::invalid_argument) {
    return fail(kExitUsage, "connect to " + from + ": expected HOST:PORT");
  }
  if (!connected) return fail(kExitConnect, "connect to " + from, connected.error());
  Peer peer = std::move(*connected);
  if (args.all) {
    auto refs = peer.list(std::chrono::milliseconds(args.timeout_ms));
    if (!refs) {
      return fail(refs.error() == errc::timed_out ? kExitTimeout : kExitFetchFailed,
                  "list objects on " + from, refs.error());
    }
    for (auto& ref : *refs) {
      std::string text = ref.to_string();
      targets.push_back({std::move(ref), std::move(text), nullptr});
    }
  }

  summary.transport = peer.transport();
  const int rc = fetch_targets(args, peer, targets, summary);
  summary.pool = (*ctx)->pool_stats();
  (*ctx)->close();  // fails whatever is still in flight after an error
  if (rc != kExitOk) return rc;
  if (!args.manifest.empty()) {
    summary.verified =
        summary.mismatched ? FetchSummary::Verified::kFailed : FetchSummary::Verified::kYes;
  }
  return summary.mismatched ? kExitVerifyFailed : kExitOk;
}

}  // namespace

int run_fetch(const FetchArgs& args, ContextOptions options) {
  FetchSummary summary;
  std::string from;
  const int rc = fetch_all(args, std::move(options), summary, from);
  if (args.json) {
    // Pure JSON on stdout, success or not: what completed, and "error" (null on success).
    std::fputs(summary_json(summary).c_str(), stdout);
  } else if ((rc == kExitOk || rc == kExitVerifyFailed) && !args.quiet) {
    std::printf("ferry fetch from %s, %d in flight (at most %s beyond two)\n", from.c_str(),
                args.concurrency, format_bytes(*parse_size(args.window_bytes)).c_str());
    print_table(stdout, summary);
  }
  return rc;
}

}  // namespace ferry::cli
