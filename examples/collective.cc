// N local processes form a group and run every collective, each checking its results.
//
//   ferry_example_collective [N]      (default 4)
//
// The parent forks N ranks. Each listens on 127.0.0.1 (any port), publishes its address in a
// shared directory, waits (bounded) for everyone else's, joins the group and runs allreduce
// (int64 sum, exact; float32 sum on a size above the recursive-doubling threshold), broadcast,
// allgather and reduce-scatter, verifying each against a locally computed reference. The parent
// waits for all of them (60 s at most) and exits 0 only if every rank did.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ferry/collective/group.h"
#include "ferry/ferry.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ferry::collective::Group;
using ferry::collective::ReduceOp;

namespace {

// Rank r's i-th int64: its reference sum over n ranks is n*i + n*(n-1)/2.
int64_t value(int r, size_t i) { return static_cast<int64_t>(i) + r; }

bool check(bool ok, int rank, const char* what) {
  std::printf("rank %d: %-14s %s\n", rank, what, ok ? "ok" : "WRONG");
  return ok;
}

std::vector<std::string> wait_for_addresses(const fs::path& dir, int n) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::vector<std::string> addresses(n);
  for (int r = 0; r < n; ++r) {
    while (!fs::exists(dir / std::to_string(r))) {
      if (std::chrono::steady_clock::now() > deadline) return {};
      std::this_thread::sleep_for(10ms);
    }
    std::ifstream(dir / std::to_string(r)) >> addresses[r];
  }
  return addresses;
}

int run_rank(int rank, int n, const fs::path& dir) {
  ferry::Context ctx({.name = "rank" + std::to_string(rank)});
  auto port = ctx.listen("127.0.0.1:0");
  if (!port) return 2;
  {
    const auto tmp = dir / ("." + std::to_string(rank));
    std::ofstream(tmp) << "127.0.0.1:" << *port << "\n";
    fs::rename(tmp, dir / std::to_string(rank));  // appears complete or not at all
  }
  auto addresses = wait_for_addresses(dir, n);
  if (addresses.empty()) return 3;
  ferry::collective::Status why;
  auto group = Group::join(ctx, addresses, rank, {.name = "example"}, &why);
  if (!group) {
    std::printf("rank %d: join failed: %s\n", rank, why.message.c_str());
    return 4;
  }
  Group& g = **group;
  bool ok = true;

  // allreduce, int64 sum: exact.
  const size_t count = 100003;  // not a multiple of n
  std::vector<int64_t> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
  auto s =
      g.allreduce(std::as_writable_bytes(std::span(data)), ferry::DType::kInt64, ReduceOp::kSum);
  bool same = s.ok();
  for (size_t i = 0; same && i < count; ++i) {
    same = data[i] == static_cast<int64_t>(n * i) + n * (n - 1) / 2;
  }
  ok &= check(same, rank, "allreduce");

  // broadcast from the last rank.
  std::vector<int64_t> b(1000, rank);
  s = g.broadcast(std::as_writable_bytes(std::span(b)), n - 1);
  ok &= check(s.ok() && b == std::vector<int64_t>(1000, n - 1), rank, "broadcast");

  // allgather: every rank contributes three values.
  std::vector<int64_t> mine{rank, rank * 10, rank * 100}, all(3 * n);
  s = g.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
  same = s.ok();
  for (int q = 0; same && q < n; ++q) same = all[3 * q + 1] == q * 10;
  ok &= check(same, rank, "allgather");

  // reduce-scatter: this rank's chunk of the int64 sum.
  for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
  auto [first, last] = Group::chunk_range(count, rank, n);
  std::vector<int64_t> chunk(last - first);
  s = g.reduce_scatter(std::as_bytes(std::span(data)), std::as_writable_bytes(std::span(chunk)),
                       ferry::DType::kInt64, ReduceOp::kSum);
  same = s.ok();
  for (size_t i = first; same && i < last; ++i) {
    same = chunk[i - first] == static_cast<int64_t>(n * i) + n * (n - 1) / 2;
  }
  ok &= check(same, rank, "reduce_scatter");
  if (!s.ok()) std::printf("rank %d: %s\n", rank, s.message.c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4;
  if (n < 1 || n > 64) return 2;
  const fs::path dir = fs::temp_directory_path() / ("ferry-collective-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::fflush(stdout);  // nothing buffered is duplicated into the children
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = run_rank(r, n, dir);
      std::fflush(stdout);  // _exit does not flush stdio
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // Reap with a deadline: a rank still running after 60 s is killed and counts as a failure.
  int failures = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  fs::remove_all(dir);
  std::printf("%d ranks: %s\n", n, failures ? "FAILED" : "every collective verified");
  return failures ? 1 : 0;
}
