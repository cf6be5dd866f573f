#include "cli/collective.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <thread>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "cli/pretty_json.h"
#include "cli/status.h"
#include "cli/units.h"
#include "ferry/collective/group.h"
#include "ferry/ferry.h"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using collective::Group;
using collective::ReduceOp;
using std::chrono::milliseconds;

// Rank r's i-th value: small integers, so float32 sums are exact and checkable bit for bit.
template <typename T>
T value(int r, size_t i) {
  return static_cast<T>(i % 1024 + static_cast<size_t>(r));
}
// Their sum over n ranks.
template <typename T>
T sum_of(int n, size_t i) {
  return static_cast<T>(n * (i % 1024) + static_cast<size_t>(n * (n - 1) / 2));
}

// One rank's view of the run: prints only on rank 0 (every rank checks its own results and
// says on stderr what was wrong). Every rank keeps a row per collective and size for --json.
class Rank {
 public:
  Rank(Group& g, const CollectiveArgs& a) : g_(g), a_(a), n_(g.size()), r_(g.rank()) {}

  bool run(const std::vector<uint64_t>& sizes) {
    if (r_ == 0 && !a_.json) {
      std::printf("%-15s %10s %-12s %8s %10s %12s %12s\n", "collective", "size", "dtype/op",
                  "result", "median", "algbw", "busbw");
    }
    for (uint64_t size : sizes) {
      allreduce<float>(size, DType::kFloat32, "float32 sum", a_.iterations);
      allreduce<int64_t>(size, DType::kInt64, "int64 sum", 0);
      broadcast(size);
      allgather(size);
      reduce_scatter(size);
    }
    return ok_;
  }

  // A row per collective and size: what, bytes, verified, the error, and the timings.
  const boost::json::array& rows() const { return rows_; }

 private:
  template <typename T>
  void allreduce(uint64_t size, DType dtype, const char* what, int timed) {
    const size_t count = std::max<size_t>(1, size / sizeof(T));
    std::vector<T> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = value<T>(r_, i);
    auto s = g_.allreduce(std::as_writable_bytes(std::span(data)), dtype, ReduceOp::kSum);
    bool good = s.ok();
    for (size_t i = 0; good && i < count; ++i) good = data[i] == sum_of<T>(n_, i);
    std::vector<double> seconds;
    for (int k = 0; good && k < timed; ++k) {
      const auto t0 = Clock::now();
      s = g_.allreduce(std::as_writable_bytes(std::span(data)), dtype, ReduceOp::kSum);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      good = s.ok();
    }
    report("allreduce", count * sizeof(T), what, good, s, seconds);
  }

  void broadcast(uint64_t size) {
    bool good = true;
    collective::Status s;
    for (int root = 0; good && root < n_; ++root) {
      std::vector<uint8_t> data(size, static_cast<uint8_t>(r_));
      s = g_.broadcast(std::as_writable_bytes(std::span(data)), root);
      good = s.ok() && std::all_of(data.begin(), data.end(), [&](uint8_t b) { return b == root; });
    }
    report("broadcast", size, "every root", good, s, {});
  }

  void allgather(uint64_t size) {
    const size_t each = std::max<size_t>(1, size / static_cast<size_t>(n_));
    std::vector<uint8_t> in(each, static_cast<uint8_t>(r_ + 1)), out(each * n_);
    auto s = g_.allgather(std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)));
    bool good = s.ok();
    for (size_t i = 0; good && i < out.size(); ++i) good = out[i] == i / each + 1;
    report("allgather", out.size(), "bytes", good, s, {});
  }

  void reduce_scatter(uint64_t size) {
    const size_t count = std::max<size_t>(1, size / sizeof(int64_t));
    std::vector<int64_t> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = value<int64_t>(r_, i);
    auto [first, last] = Group::chunk_range(count, r_, n_);
    std::vector<int64_t> out(last - first);
    auto s = g_.reduce_scatter(std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)),
                               DType::kInt64, ReduceOp::kSum);
    bool good = s.ok();
    for (size_t i = first; good && i < last; ++i) good = out[i - first] == sum_of<int64_t>(n_, i);
    report("reduce_scatter", count * sizeof(int64_t), "int64 sum", good, s, {});
  }

  void report(const char* what, uint64_t bytes, const char* kind, bool good,
              const collective::Status& s, std::vector<double> seconds) {
    const std::string why = good ? "" : s.ok() ? "WRONG RESULT" : s.message;
    if (!good) {
      ok_ = false;
      std::fprintf(stderr, "ferry: rank %d: %s of %s %s: %s\n", r_, what,
                   format_bytes(bytes).c_str(), kind, why.c_str());
    }
    boost::json::value median_s = nullptr, algbw_gb_s = nullptr, busbw_gb_s = nullptr;
    std::string median = "-", algbw = "-", busbw = "-";
    if (!seconds.empty()) {
      std::sort(seconds.begin(), seconds.end());
      const double t = seconds[seconds.size() / 2];
      const double gbps = static_cast<double>(bytes) / t / 1e9;
      const double bus = gbps * 2.0 * (n_ - 1) / n_;  // NCCL's tests' bus bandwidth
      median_s = t;
      algbw_gb_s = gbps;
      busbw_gb_s = bus;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3f ms", t * 1e3);
      median = buf;
      std::snprintf(buf, sizeof buf, "%.3f GB/s", gbps);
      algbw = buf;
      std::snprintf(buf, sizeof buf, "%.3f GB/s", bus);
      busbw = buf;
    }
    rows_.push_back(boost::json::object{{"collective", what},
                                        {"bytes", bytes},
                                        {"kind", kind},
                                        {"verified", good},
                                        {"message", why},
                                        {"median_s", median_s},
                                        {"algbw_gb_s", algbw_gb_s},
                                        {"busbw_gb_s", busbw_gb_s}});
    if (r_ != 0 || a_.json) return;
    std::printf("%-15s %10s %-12s %8s %10s %12s %12s\n", what, format_bytes(bytes).c_str(), kind,
                good ? "ok" : "WRONG", median.c_str(), algbw.c_str(), busbw.c_str());
    std::fflush(stdout);
  }

  Group& g_;
  const CollectiveArgs& a_;
  const int n_;
  const int r_;
  bool ok_ = true;
  boost::json::array rows_;
};

fs::path report_path(const fs::path& dir, int rank) {
  return dir / ("report." + std::to_string(rank) + ".json");
}

// With --json, a rank's report for the parent: {"rows": [...], "error": its first failure}.
void write_report(const fs::path& dir, int rank, const boost::json::array& rows) {
  const auto tmp = dir / (".report." + std::to_string(rank));
  std::ofstream(tmp) << boost::json::serialize(
      boost::json::object{{"rows", rows}, {"error", failure_value()}});
  fs::rename(tmp, report_path(dir, rank));  // appears complete or not at all
}

// Waits (bounded) until every rank has published its address in `dir`.
std::vector<std::string> gather_addresses(const fs::path& dir, int n, Clock::time_point deadline) {
  std::vector<std::string> addresses(n);
  for (int r = 0; r < n; ++r) {
    while (!fs::exists(dir / std::to_string(r))) {
      if (Clock::now() > deadline) return {};
      std::this_thread::sleep_for(milliseconds(10));
    }
    std::ifstream(dir / std::to_string(r)) >> addresses[r];
  }
  return addresses;
}

int run_rank(int rank, const CollectiveArgs& a, ContextOptions options,
             const std::vector<uint64_t>& sizes, const fs::path& dir, boost::json::array& rows) {
  options.name = "rank" + std::to_string(rank);
  if (a.transport != "auto") options.transports = {a.transport};
  auto ctx = Context::create(options);
  if (!ctx) return fail(kExitUsage, "cannot create a context", ctx.error());
  auto port = (*ctx)->listen(a.host + ":0");
  if (!port) return fail(kExitConnect, "cannot listen on " + a.host, port.error());
  const auto tmp = dir / ("." + std::to_string(rank));
  std::ofstream(tmp) << a.host << ":" << *port << "\n";
  fs::rename(tmp, dir / std::to_string(rank));  // appears complete or not at all
  auto addresses = gather_addresses(dir, a.ranks, Clock::now() + std::chrono::seconds(30));
  if (addresses.empty()) return fail(kExitTimeout, "the other ranks did not start");
  collective::Status why;
  auto group = Group::join(**ctx, addresses, rank, {.name = "ferry-collective"}, &why);
  if (!group) return fail(kExitConnect, "rank " + std::to_string(rank) + ": " + why.message);
  Rank r(**group, a);
  const bool ok = r.run(sizes);
  rows = r.rows();
  return ok ? kExitOk : kExitVerifyFailed;
}

// The --json document, from the reports the ranks wrote: rank 0's rows (the timings), every
// rank's failed rows and every rank's own error; a rank that wrote no report (killed, or it
// crashed) is named in "missing_ranks".
std::string run_json(const CollectiveArgs& a, const fs::path& dir, int worst) {
  boost::json::array results, failures, rank_errors, missing;
  for (int r = 0; r < a.ranks; ++r) {
    std::ifstream in(report_path(dir, r));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    boost::system::error_code ec;
    auto report = boost::json::parse(text, ec);
    if (ec || !report.is_object()) {
      missing.push_back(r);
      continue;
    }
    if (const auto& error = report.at("error"); !error.is_null()) {
      rank_errors.push_back(boost::json::object{{"rank", r}, {"error", error}});
    }
    for (auto& row : report.at("rows").as_array()) {
      if (r == 0) results.push_back(row);
      if (!row.as_object().at("verified").as_bool()) {
        boost::json::object failed{{"rank", r}};
        for (const auto& member : row.as_object()) failed.insert(member);
        failures.push_back(std::move(failed));
      }
    }
  }
  return pretty_json(boost::json::object{{"ranks", a.ranks},
                                         {"host", a.host},
                                         {"transport", a.transport},
                                         {"results", std::move(results)},
                                         {"failures", std::move(failures)},
                                         {"rank_errors", std::move(rank_errors)},
                                         {"missing_ranks", std::move(missing)},
                                         {"verified", worst == kExitOk},
                                         {"exit_code", worst},
                                         {"error", failure_value()}});
}

}  // namespace

int run_collective(const CollectiveArgs& a, const ContextOptions& options) {
  // A failure before any rank ran: with --json, stdout still holds one document.
  const auto early = [&](int rc) {
    if (a.json) std::fputs(failure_json().c_str(), stdout);
    return rc;
  };
  std::vector<uint64_t> sizes;
  for (const auto& text : a.sizes) {
    auto size = parse_size(text);
    if (!size || *size == 0) return early(fail(kExitUsage, "bad size '" + text + "'"));
    sizes.push_back(*size);
  }
  // A directory of this run's own (mkdtemp: created here, mode 0700), never one found in place:
  // the ranks trust the addresses and reports they read from it.
  std::string tmpl = (fs::temp_directory_path() / "ferry-collective-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return early(fail(kExitUsage, "cannot make a directory in " +
                                      fs::temp_directory_path().string() + ": " +
                                      std::strerror(errno)));
  }
  const fs::path dir = tmpl;
  if (!a.json) {
    std::printf("%d ranks on %s, transport %s\n", a.ranks, a.host.c_str(), a.transport.c_str());
  }
  std::fflush(stdout);  // nothing buffered is duplicated into the children
  std::vector<pid_t> pids;
  for (int r = 0; r < a.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = kExitUsage;
      boost::json::array rows;
      try {
        rc = run_rank(r, a, options, sizes, dir, rows);
      } catch (const std::exception& e) {
        rc = fail(kExitUsage, "rank " + std::to_string(r) + ": " + e.what());
      }
      if (a.json) write_report(dir, r, rows);
      std::fflush(nullptr);
      _exit(rc);
    }
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      fs::remove_all(dir);
      return early(fail(kExitUsage, "fork failed"));
    }
    pids.push_back(pid);
  }
  // Reap with a deadline: a rank still running then is killed and the run timed out.
  int worst = kExitOk;
  const auto deadline = Clock::now() + std::chrono::seconds(a.timeout_s);
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    const pid_t pid = pids[rank];
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        worst = kExitTimeout;
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (worst != kExitOk) continue;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) worst = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
      // A rank that died (a crash, a kill) verified nothing more: the run failed.
      std::fprintf(stderr, "ferry: rank %zu died of signal %d (%s)\n", rank, WTERMSIG(status),
                   strsignal(WTERMSIG(status)));
      worst = kExitFetchFailed;
    }
  }
  if (worst == kExitTimeout) {
    fail(kExitTimeout,
         "ranks still running after " + std::to_string(a.timeout_s) + " s were killed");
  } else if (worst != kExitOk) {
    fail(static_cast<ExitCode>(worst), "a rank failed (it said why on stderr)");
  }
  if (a.json) {
    std::fputs(run_json(a, dir, worst).c_str(), stdout);
  } else {
    std::printf("%d ranks: %s\n", a.ranks,
                worst == kExitOk ? "every collective verified on every rank" : "FAILED");
  }
  fs::remove_all(dir);
  return worst;
}

}  // namespace ferry::cli
