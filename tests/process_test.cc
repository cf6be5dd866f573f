// Real processes: a serving process killed with SIGKILL in the middle of large fetches.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ferry::test {
namespace {

// A child process running the test server; killed (and reaped) on destruction.
class ServerProcess {
 public:
  // With `ready_line` "fetching", runs the fetching mode instead (args after "fetch").
  explicit ServerProcess(const std::vector<std::string>& sizes,
                         const std::string& ready_line = "ready") {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv{const_cast<char*>(FERRY_TEST_SERVER)};  // then the arguments
      for (const auto& s : sizes) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execv(FERRY_TEST_SERVER, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    for (std::string line; read_line(line, 20s) && line != ready_line;) {
      if (line.rfind("listening ", 0) == 0) address = test_host() + ":" + line.substr(10);
      if (line.rfind("ref ", 0) == 0) refs.push_back(*ObjectRef::from_string(line.substr(4)));
    }
    if (ready_line == "ready") EXPECT_FALSE(address.empty()) << "test server did not start";
  }
  ~ServerProcess() {
    kill(SIGKILL);
    if (out_ >= 0) ::close(out_);
  }
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGKILL) {
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::string address;
  std::vector<ObjectRef> refs;

 private:
  bool read_line(std::string& line, std::chrono::milliseconds timeout) {
    line.clear();
    for (;;) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
      char c;
      if (::read(out_, &c, 1) != 1) return false;
      if (c == '\n') return true;
      line.push_back(c);
    }
  }
  pid_t pid_ = -1;
  int out_ = -1;
};

TEST(Process, ServerKilledMidFetchFailsEveryPendingFutureWithPeerScope) {
  constexpr size_t kBig = 256u << 20;
  ServerProcess doomed({std::to_string(kBig), std::to_string(kBig), "1000"});
  ASSERT_EQ(doomed.refs.size(), 3u);
  Context client(client_options("survivor"));
  auto peer = connect_or_fail(client, doomed.address);
  ASSERT_TRUE(peer.valid());
  std::vector<FetchRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(peer.fetch(doomed.refs[i % 2]));
  // Let bytes flow, freeze the server mid-transfer, then kill it.
  std::this_thread::sleep_for(20ms);
  doomed.kill(SIGSTOP);
  int pending = 0;
  for (auto& r : reqs) pending += !r.done();
  ASSERT_GT(pending, 0) << "every fetch finished before the kill: the test proves nothing";
  doomed.kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& r : reqs) {
    auto ec = r.wait(10s);
    ASSERT_NE(ec, errc::timed_out) << "a future did not complete after the owner died";
    if (ec) {
      EXPECT_EQ(scope_of(ec), Scope::peer) << ec.message();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_FALSE(peer.is_open());
  EXPECT_EQ(scope_of(peer.fetch(doomed.refs[2]).wait(5s)), Scope::peer);

  // The client is healthy: it connects to another server and fetches byte-exact.
  ServerProcess other({"5000000"});
  auto peer2 = connect_or_fail(client, other.address);
  auto req = peer2.fetch(other.refs.at(0));
  ASSERT_FALSE(req.wait(20s));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *make_pattern(5000000, 1)));
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(Process, FetcherKilledMidFetchLeavesTheServerClean) {
  Server server;
  auto big = make_pattern(64u << 20, 3);
  auto small = make_pattern(100000, 4);
  auto big_ref = server.put(big);
  auto small_ref = server.put(small);
  Context other(client_options("other"));  // a second peer, served throughout
  auto other_peer = connect_or_fail(other, server.address());
  for (int i = 0; i < 400 && server.ctx.peer_count() < 1; ++i) std::this_thread::sleep_for(5ms);
  const size_t fds_before = open_fds();
  const size_t peers_before = server.ctx.peer_count();
  for (int round = 0; round < 3; ++round) {
    {
      ServerProcess fetcher({"fetch", server.address(), big_ref.to_string(), small_ref.to_string()},
                            "fetching");
      std::this_thread::sleep_for(std::chrono::milliseconds(30 + 40 * round));
      fetcher.kill(SIGKILL);
    }  // (its pipe to this process is closed here)
    // The survivor notices at once (socket reset), drops the session and every pin it caused.
    bool clean = false;
    for (int i = 0; i < 1000 && !clean; ++i) {
      clean = server.ctx.peer_count() == peers_before &&
              server.ctx.store().counts(big_ref.object_id)->pins == 0 && open_fds() == fds_before;
      if (!clean) std::this_thread::sleep_for(5ms);
    }
    EXPECT_TRUE(clean) << "round " << round << ": peers " << server.ctx.peer_count() << "/"
                       << peers_before << ", pins "
                       << server.ctx.store().counts(big_ref.object_id)->pins << ", fds "
                       << open_fds() << "/" << fds_before;
    // And it keeps serving the other peer.
    auto req = other_peer.fetch(small_ref);
    ASSERT_FALSE(req.wait(30s));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], *small));
  }
}

TEST(Process, FrozenServerIsDeclaredDeadByHeartbeats) {
  ServerProcess frozen({"1000"});
  ContextOptions options = client_options("watcher");
  options.heartbeat_interval = 100ms;
  options.peer_timeout = 800ms;
  Context client(options);
  auto peer = connect_or_fail(client, frozen.address);
  frozen.kill(SIGSTOP);
  auto req = peer.fetch(frozen.refs.at(0));
  auto ec = req.wait(10s);
  EXPECT_EQ(ec, errc::peer_unresponsive) << ec.message();
  EXPECT_EQ(scope_of(ec), Scope::peer);
}

}  // namespace
}  // namespace ferry::test
