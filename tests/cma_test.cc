// The same-host transport (CMA) with real processes: byte-exact fetches of every shape out of
// another process's memory, selection, aborts mid-copy, an owner killed mid-copy, a late copy
// refused by the grant's lease word, and a fetcher the kernel does not let read its owner (it
// falls back to TCP).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <filesystem>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "ferry/cma/lease_board.h"
#include "tests/child_process.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

FetchOptions over_cma() {
  FetchOptions o;
  o.transport = cma::kTransportName;
  return o;
}

// A client whose CMA copies in small steps with several threads, so that objects of a few MiB
// take several steps and every step several shares.
ContextOptions stepping_client(std::string name, bool preferred = false) {
  ContextOptions o = client_options(std::move(name));
  auto& cma = o.transport_options_for<cma::CmaOptions>(cma::kTransportName);
  cma.copy_step = 1u << 20;
  cma.copy_threads = 3;
  cma.preferred = preferred;
  return o;
}

// CMA's own tests: on the host, plain or as the cma.* variant; the rdma.* variant in the guest
// skips them (they are about CMA, not about the suite's transport).
struct Cma : ::testing::Test {
  void SetUp() override {
    if (test_transport() != "TCP" && test_transport() != cma::kTransportName) {
      GTEST_SKIP() << "SKIPPED: CMA's own tests do not run over " << test_transport()
                   << " (they run on the host)";
    }
  }
};

double metric(const Context& ctx, const std::string& name) {
  return transport_metric(ctx, cma::kTransportName, name);
}

TEST_F(Cma, FetchesEverySizeByteExactIntoTargetsAndIntoFerrysMemory) {
  Server server;
  Context client(stepping_client("cma-client"));
  auto peer = connect_or_fail(client, server.address());
  PutPatterns objects;
  // Inside a grant (up to 64 KiB), just above it, one share, several steps of several shares.
  const std::vector<size_t> sizes = {1,          4096,     64u << 10,      (64u << 10) + 1,
                                     600u << 10, 3u << 20, (20u << 20) + 7};
  for (size_t i = 0; i < sizes.size(); ++i) objects.put(server, sizes[i], i + 1);
  uint64_t moved = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto req = peer.fetch(objects.refs[i], {}, over_cma());
    ASSERT_FALSE(req.wait(scaled(20s))) << sizes[i];
    EXPECT_EQ(req.result().transport, cma::kTransportName);
    EXPECT_TRUE(same_bytes(req.result().tensors.at(0), *objects.data[i])) << sizes[i];
    EXPECT_EQ(req.bytes_landed(), sizes[i]);
    std::vector<std::byte> into(sizes[i]);
    auto req2 = peer.fetch(objects.refs[i], {MutableBuffer(into)}, over_cma());
    ASSERT_FALSE(req2.wait(scaled(20s))) << sizes[i];
    EXPECT_TRUE(same_bytes(into, *objects.data[i])) << sizes[i];
    moved += 2 * sizes[i];
  }
  EXPECT_EQ(metric(client, "bytes_copied_total"), static_cast<double>(moved));
  EXPECT_EQ(metric(client, "fetches_total"), 2.0 * sizes.size());
  EXPECT_TRUE(eventually(
      [&] { return server.ctx.stats().bytes_served_by_transport[cma::kTransportName] == moved; }));
}

TEST_F(Cma, FetchesAnObjectOfSeveralTensorsIncludingAnEmptyOne) {
  Server server;
  Context client(stepping_client("cma-client"));
  auto peer = connect_or_fail(client, server.address());
  auto a = make_pattern(5u << 20, 1), b = make_pattern(300, 2);
  auto keep =
      std::make_shared<std::vector<std::shared_ptr<std::vector<std::byte>>>>(std::vector{a, b});
  auto ref = server.ctx.put({Tensor::bytes(*a), Tensor::bytes({}), Tensor::bytes(*b)}, keep);
  ASSERT_TRUE(ref.ok());
  auto req = peer.fetch(*ref, {}, over_cma());
  ASSERT_FALSE(req.wait(scaled(20s)));
  const auto& got = req.result().tensors;
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(same_bytes(got[0], *a));
  EXPECT_EQ(got[1].size(), 0u);
  EXPECT_TRUE(same_bytes(got[2], *b));
}

TEST_F(Cma, AutoPicksTcpOnThisHostUnlessCmaIsPreferred) {
  Server server;
  PutPatterns objects;
  objects.put(server, 1u << 20, 1);
  Context plain(ContextOptions{.name = "plain"});
  {
    auto peer = connect_or_fail(plain, server.address());
    auto req = peer.fetch(objects.refs[0]);
    ASSERT_FALSE(req.wait(scaled(20s)));
    EXPECT_EQ(req.result().transport, tcp::kTransportName);
  }
  Context preferring(stepping_client("preferring", /*preferred=*/true));
  auto peer = connect_or_fail(preferring, server.address());
  auto req = peer.fetch(objects.refs[0]);
  ASSERT_FALSE(req.wait(scaled(20s)));
  EXPECT_EQ(req.result().transport, cma::kTransportName);
  EXPECT_TRUE(same_bytes(req.result().tensors.at(0), *objects.data[0]));
}

TEST_F(Cma, AnAbortMidCopyStopsItAndTheObjectServesAgain) {
  Server server;
  PutPatterns objects;
  objects.put(server, 256u << 20, 1);
  ContextOptions o = stepping_client("aborting");
  o.transport_options_for<cma::CmaOptions>(cma::kTransportName).copy_step = 256u << 10;
  Context client(o);
  auto peer = connect_or_fail(client, server.address());
  std::vector<std::byte> into(256u << 20);
  auto req = peer.fetch(objects.refs[0], {MutableBuffer(into)}, over_cma());
  ASSERT_TRUE(eventually([&] { return req.bytes_landed() > 0 || req.done(); }, 20s));
  req.abort();
  const auto ec = req.wait(scaled(20s));
  ASSERT_NE(ec, errc::timed_out);
  if (!ec) GTEST_SKIP() << "SKIPPED: the whole copy finished before the abort (a fast machine)";
  EXPECT_EQ(ec, errc::aborted) << ec.message();
  EXPECT_LT(req.bytes_landed(), 256u << 20);
  auto again = peer.fetch(objects.refs[0], {MutableBuffer(into)}, over_cma());
  ASSERT_FALSE(again.wait(scaled(30s)));
  EXPECT_TRUE(same_bytes(into, *objects.data[0]));
}

TEST_F(Cma, FetchesFromAnotherProcess) {
  ChildProcess owner({std::to_string(64u << 20), "1000"});
  ASSERT_EQ(owner.refs.size(), 2u);
  Context client(stepping_client("cma-client"));
  auto peer = connect_or_fail(client, owner.address);
  for (size_t i = 0; i < 2; ++i) {
    auto req = peer.fetch(owner.refs[i], {}, over_cma());
    ASSERT_FALSE(req.wait(scaled(20s)));
    EXPECT_EQ(req.result().transport, cma::kTransportName);
    EXPECT_TRUE(
        same_bytes(req.result().tensors.at(0), *make_pattern(i == 0 ? 64u << 20 : 1000, i + 1)));
  }
}

TEST_F(Cma, AnOwnerKilledMidCopyFailsEveryFetchPromptly) {
  constexpr size_t kBig = 256u << 20;
  ChildProcess owner({std::to_string(kBig)});
  ASSERT_EQ(owner.refs.size(), 1u);
  ContextOptions o = stepping_client("survivor");
  o.transport_options_for<cma::CmaOptions>(cma::kTransportName).copy_step = 256u << 10;
  o.transport_options_for<cma::CmaOptions>(cma::kTransportName).copy_threads = 1;
  Context client(o);
  auto peer = connect_or_fail(client, owner.address);
  std::vector<FetchRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(peer.fetch(owner.refs[0], {}, over_cma()));
  ASSERT_TRUE(eventually([&] { return reqs[0].bytes_landed() > 0 || reqs[0].done(); }, 20s));
  int pending = 0;
  for (auto& r : reqs) pending += !r.done();
  if (pending == 0) GTEST_SKIP() << "SKIPPED: every fetch finished before the kill (fast machine)";
  owner.kill(SIGKILL);
  for (auto& r : reqs) {
    const auto ec = r.wait(scaled(10s));
    ASSERT_NE(ec, errc::timed_out) << "a fetch did not complete after its owner died";
    if (ec) {
      EXPECT_EQ(scope_of(ec), Scope::peer) << ec.message();
    }
  }
}

// A fetcher that stops mid-copy (its io thread blocked here) holds its grant no longer than the
// owner's lease timeout; when it runs again, the bytes it copied are refused (the owner no longer
// held the object) and the fetch fails; the next one succeeds.
TEST_F(Cma, AGrantEndsAtTheLeaseTimeoutAndALateCopyIsRefused) {
  ContextOptions o;
  o.lease_timeout = 300ms;
  Server server(o);
  PutPatterns objects;
  objects.put(server, 256u << 20, 7);
  ContextOptions c = stepping_client("stalled");
  c.transport_options_for<cma::CmaOptions>(cma::kTransportName).copy_step = 256u << 10;
  c.transport_options_for<cma::CmaOptions>(cma::kTransportName).copy_threads = 1;
  Context client(c);
  auto peer = connect_or_fail(client, server.address());
  auto req = peer.fetch(objects.refs[0], {}, over_cma());
  ASSERT_TRUE(eventually([&] { return req.bytes_landed() > 0 || req.done(); }, 20s));
  std::promise<void> gate;  // the copy's next step waits behind this
  boost::asio::post(client.io_context(), [f = gate.get_future().share()] { f.wait_for(30s); });
  if (req.done()) {
    gate.set_value();
    GTEST_SKIP() << "SKIPPED: the whole copy finished before the stall (a fast machine)";
  }
  const bool expired = eventually(
      [&] {
        const auto errors = server.ctx.stats().serve_errors;
        auto it = errors.find("timed_out");
        return it != errors.end() && it->second > 0;
      },
      10s);
  gate.set_value();
  EXPECT_TRUE(expired) << "the grant did not end at the lease timeout";
  const auto ec = req.wait(scaled(20s));
  ASSERT_TRUE(req.done()) << "the fetch did not complete after its grant ended";
  // The owner's word for the request (timed_out) or its answer to the release (not kept: aborted),
  // whichever comes first; never success.
  EXPECT_TRUE(ec == errc::timed_out || ec == errc::aborted) << ec.message();
  ASSERT_TRUE(fetch_completes(peer, objects.refs[0], *objects.data[0], 20s));
}

// The fetcher runs as another user without privileges: the kernel refuses it the owner's memory
// (process_vm_readv: EPERM), so its CMA channel is refused and its fetches, which prefer CMA,
// go over TCP instead.
TEST_F(Cma, AFetcherTheKernelDoesNotLetReadFallsBackToTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "SKIPPED: needs root to start a fetcher as another user";
  if (!std::filesystem::exists("/usr/bin/setpriv")) {
    GTEST_SKIP() << "SKIPPED: needs setpriv (util-linux) to start a fetcher as another user";
  }
  Server server;
  PutPatterns objects;
  objects.put(server, 2u << 20, 7);
  ChildProcess fetcher({"fetch", server.address(),
                        "7@" + std::to_string(2u << 20) + "@" + objects.refs[0].to_string()},
                       "fetching",
                       {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
                        "FERRY_TEST_TRANSPORT=CMA"});
  ASSERT_TRUE(fetcher.ready);
  int ok = 0;
  for (std::string line; ok < 16 && fetcher.read_line(line, scaled(20s));) {
    ASSERT_EQ(line.rfind("ok ", 0), 0u) << "the unprivileged fetcher said: " << line;
    ++ok;
  }
  EXPECT_EQ(ok, 16);
  // The owner served every one of them over TCP, none over CMA.
  EXPECT_TRUE(eventually(
      [&] { return server.ctx.stats().bytes_served_by_transport["TCP"] >= 16 * (2u << 20); }, 5s));
  EXPECT_EQ(server.ctx.stats().bytes_served_by_transport.count(cma::kTransportName), 0u);
}

// The lease words: a grant's token is in its word until revoked, a slot used again gets a token
// never handed out before (a late reader of the old grant sees a mismatch), 0 is never a token.
TEST(CmaLeaseBoard, ATokenHoldsUntilRevokedAndIsNeverHandedOutAgain) {
  cma::LeaseBoard board;
  std::vector<cma::LeaseBoard::Slot> slots;
  std::set<uint64_t> tokens;
  for (int i = 0; i < 1500; ++i) {  // several chunks
    slots.push_back(board.acquire());
    ASSERT_TRUE(slots.back());
    EXPECT_NE(slots.back().token, 0u);
    EXPECT_TRUE(tokens.insert(slots.back().token).second);
  }
  std::set<const void*> words;
  for (const auto& s : slots) {
    EXPECT_TRUE(words.insert(s.word).second) << "two live grants share a word";
    EXPECT_TRUE(cma::LeaseBoard::holds(s.word->load(), s.token));
  }
  const auto old = slots[7];
  board.revoke(old);
  EXPECT_EQ(old.word->load(), 0u);
  EXPECT_FALSE(cma::LeaseBoard::holds(old.word->load(), old.token));
  const auto again = board.acquire();  // the freed word, with a new token
  EXPECT_EQ(again.word, old.word);
  EXPECT_TRUE(tokens.insert(again.token).second);
  EXPECT_FALSE(cma::LeaseBoard::holds(again.word->load(), old.token));
  EXPECT_TRUE(cma::LeaseBoard::holds(again.word->load(), again.token));
  EXPECT_FALSE(cma::LeaseBoard::holds(0, 0));
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i != 7) board.revoke(slots[i]);
  }
  board.revoke(again);
}

}  // namespace
}  // namespace ferry::test
