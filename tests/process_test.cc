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

#include "tests/child_process.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

TEST(Process, ServerKilledMidFetchFailsEveryPendingFutureWithPeerScope) {
  FERRY_REQUIRE_TEST_HOST();
  constexpr size_t kBig = 256u << 20;
  ChildProcess doomed({std::to_string(kBig), std::to_string(kBig), "1000"});
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
    auto ec = r.wait(scaled(10s));
    ASSERT_NE(ec, errc::timed_out) << "a future did not complete after the owner died";
    if (ec) {
      EXPECT_EQ(scope_of(ec), Scope::peer) << ec.message();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(5s));
  // Over CMA the fetches fail as their reads of the dead process do (ESRCH), which can come
  // before the session has read the connection's end: the peer is closed promptly, not first.
  EXPECT_TRUE(eventually([&] { return !peer.is_open(); }, 5s)) << "the dead peer stays open";
  EXPECT_EQ(scope_of(peer.fetch(doomed.refs[2]).wait(scaled(5s))), Scope::peer);

  // The client is healthy: it connects to another server and fetches byte-exact.
  ChildProcess other({"5000000"});
  auto peer2 = connect_or_fail(client, other.address);
  auto req = peer2.fetch(other.refs.at(0));
  ASSERT_FALSE(req.wait(scaled(20s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *make_pattern(5000000, 1)));
}

TEST(Process, FetcherKilledMidFetchLeavesTheServerClean) {
  FERRY_REQUIRE_TEST_HOST();
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
      ChildProcess fetcher({"fetch", server.address(), big_ref.to_string(), small_ref.to_string()},
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
    ASSERT_FALSE(req.wait(scaled(30s)));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], *small));
  }
}

// A process the application spawns must not inherit ferry's connections: it would keep them
// open after this process closes them (or dies), and peers would not see the reset.
TEST(Process, SpawnedProcessesInheritNoFerrySocket) {
  FERRY_REQUIRE_TEST_HOST();
  Server server;
  auto ref = server.put(make_pattern(100000, 9));
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  ASSERT_FALSE(peer.fetch(ref).wait(scaled(30s)));  // metadata and data channels are open now
  size_t sockets = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || target.rfind("socket:", 0) != 0) continue;
    const int fd = std::stoi(e.path().filename().string());
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) continue;  // the directory iterator's own descriptor, gone by now
    ++sockets;
    EXPECT_TRUE(flags & FD_CLOEXEC) << "socket fd " << fd << " would be inherited by exec";
  }
  // The listener and both ends of the metadata connection; over TCP, both ends of the data one.
  EXPECT_GE(sockets, test_transport() == "TCP" ? 5u : 3u);
}

TEST(Process, FrozenServerIsDeclaredDeadByHeartbeats) {
  FERRY_REQUIRE_TEST_HOST();
  ChildProcess frozen({"1000"});
  ContextOptions options = client_options("watcher");
  options.heartbeat_interval = 100ms;
  options.peer_timeout = 800ms;
  Context client(options);
  auto peer = connect_or_fail(client, frozen.address);
  frozen.kill(SIGSTOP);
  auto req = peer.fetch(frozen.refs.at(0));
  auto ec = req.wait(scaled(10s));
  EXPECT_EQ(ec, errc::peer_unresponsive) << ec.message();
  EXPECT_EQ(scope_of(ec), Scope::peer);
}

}  // namespace
}  // namespace ferry::test
