// RDMA on real rxe devices, inside the soft-RoCE guest (tests/softroce/ferry-vm): servers on
// rxe1 ($FERRY_RDMA_PEER_IP), clients on rxe0, RoCE v2 packets across the veth pair.
// Outside the guest every test here is skipped, loudly.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <random>
#include <set>
#include <thread>

#include "rdma/rdma.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

// Runs a shell command in the guest; the test fails when it does.
void sh(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }

// A qdisc on both veth ends for the scope of a test.
struct Qdisc {
  explicit Qdisc(const std::string& spec) {
    for (const char* dev : {"sr0", "sr1"}) sh("tc qdisc add dev " + std::string(dev) + " " + spec);
  }
  ~Qdisc() {
    for (const char* dev : {"sr0", "sr1"}) {
      std::system(("tc qdisc del dev " + std::string(dev) + " root 2>/dev/null").c_str());
    }
  }
};

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

class Rdma : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_REQUIRE_TEST_HOST();
    if (test_transport() != "RDMA") GTEST_SKIP() << "SKIPPED: run with FERRY_TEST_TRANSPORT=RDMA";
    ASSERT_TRUE(rdma::register_rdma_transport()) << "this build has no RDMA support";
  }
};

TEST_F(Rdma, NegotiatesRdmaAcrossTheVethAndSaysSo) {
  Server server;
  ASSERT_TRUE(server.ctx.transport("RDMA")) << "no RDMA device in the guest";
  Context client({.name = "client"});  // "auto": the best transport both sides reach
  auto peer = connect_or_fail(client, server.address());
  EXPECT_EQ(peer.transport(), "RDMA");
  auto bytes = make_pattern(3u << 20, 1);
  auto ref = server.put(bytes);
  auto req = peer.fetch(ref);
  ASSERT_FALSE(req.wait(60s));
  EXPECT_EQ(req.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  EXPECT_EQ(server.ctx.transport_counts().at("RDMA"), 1u);
}

TEST_F(Rdma, PeerWithoutRdmaAgreesOnTcp) {
  auto bytes = make_pattern(1u << 20, 2);
  {
    Server tcp_only({.name = "tcp-only", .transports = {"TCP"}});
    Context client({.name = "client"});
    auto peer = connect_or_fail(client, tcp_only.address());
    EXPECT_EQ(peer.transport(), "TCP");
    auto req = peer.fetch(tcp_only.put(bytes));
    ASSERT_FALSE(req.wait(60s));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  }
  {
    Server server;
    Context tcp_client({.name = "tcp-client", .transports = {"TCP"}});
    auto peer = connect_or_fail(tcp_client, server.address());
    EXPECT_EQ(peer.transport(), "TCP");
    auto req = peer.fetch(server.put(bytes));
    ASSERT_FALSE(req.wait(60s));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  }
}

TEST_F(Rdma, ForcedRdmaAgainstATcpOnlyPeerIsAClearError) {
  Server tcp_only({.name = "tcp-only", .transports = {"TCP"}});
  Context client({.name = "client", .transport = "RDMA"});
  auto peer = client.connect(tcp_only.address());
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.error(), errc::transport_unavailable);
  // And over loopback, where no RoCE address exists, even with RDMA on both sides.
  Context lo_server({.name = "lo"});
  auto port = lo_server.listen("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  auto lo = client.connect("127.0.0.1:" + std::to_string(*port));
  ASSERT_FALSE(lo.ok());
  EXPECT_EQ(lo.error(), errc::transport_unavailable);
}

TEST_F(Rdma, BusyPollModeMovesTheSameBytes) {
  Server server;
  ContextOptions options = client_options("busy");
  options.busy_poll = true;
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(5u << 20, 3);
  auto req = peer.fetch(server.put(bytes));
  ASSERT_FALSE(req.wait(60s));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
}

TEST_F(Rdma, TenThousandViewsOfOneAllocationCostOneRegistration) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  constexpr size_t kViews = 10000;
  constexpr size_t kView = 16 * 1024;
  auto slab = make_pattern(kViews * kView, 7);
  std::span<const std::byte> all(*slab);
  std::vector<ObjectRef> refs;
  refs.reserve(kViews);
  PutOptions options;
  options.region = all;
  for (size_t i = 0; i < kViews; ++i) {
    auto ref = server.ctx.put({Tensor::bytes(all.subspan(i * kView, kView))}, slab, options);
    ASSERT_TRUE(ref.ok());
    refs.push_back(*ref);
  }
  std::vector<size_t> sample{0, kViews - 1};
  std::mt19937 rng(42);
  for (int i = 0; i < 100; ++i) sample.push_back(rng() % kViews);
  std::vector<FetchRequest> reqs;
  for (size_t i : sample) reqs.push_back(peer.fetch(refs[i]));
  for (size_t k = 0; k < sample.size(); ++k) {
    ASSERT_FALSE(reqs[k].wait(60s)) << "view " << sample[k];
    ASSERT_TRUE(same_bytes(reqs[k].result().tensors[0], all.subspan(sample[k] * kView, kView)));
  }
  auto c = rdma::registration_counters(server.ctx);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->registrations, 1u) << "every view should share the slab's registration";
  EXPECT_EQ(c->live, 1u);
  // Each distinct view looks its registration up once (repeat fetches reuse the object's).
  EXPECT_EQ(c->hits, std::set<size_t>(sample.begin(), sample.end()).size() - 1);
  for (const auto& ref : refs) server.ctx.release(ref);
  // The last object's collection deregisters the slab (after the releases of the leases).
  for (int i = 0; i < 500 && rdma::registration_counters(server.ctx)->live != 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(rdma::registration_counters(server.ctx)->live, 0u);
  EXPECT_EQ(rdma::registration_counters(server.ctx)->deregistrations, 1u);
}

TEST_F(Rdma, LeaseKeepsMemoryAliveUntilTheReadEnds) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(24u << 20, 11);
  auto expected = *bytes;
  auto freed = std::make_shared<std::atomic<bool>>(false);
  // The owner's memory tells us when it is released.
  std::shared_ptr<void> owner(new std::shared_ptr<std::vector<std::byte>>(bytes), [freed](void* p) {
    delete static_cast<std::shared_ptr<std::vector<std::byte>>*>(p);
    *freed = true;
  });
  auto ref = server.ctx.put({Tensor::bytes(*bytes)}, owner);
  ASSERT_TRUE(ref.ok());
  owner.reset();
  bytes.reset();
  auto req = peer.fetch(*ref);
  // Wait until the owner has granted (the lease pins the object), then drop its last reference.
  for (int i = 0; i < 2000 && server.ctx.store().counts(ref->object_id)->pins == 0; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(server.ctx.store().counts(ref->object_id)->pins, 1u);
  ASSERT_FALSE(req.done()) << "the READ finished before the release: the test proves nothing";
  EXPECT_TRUE(server.ctx.release(*ref));
  EXPECT_FALSE(*freed) << "memory freed while a READ may still touch it";
  ASSERT_FALSE(req.wait(120s));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], expected));
  // The fetcher's release ends the lease; then the object is collected and the memory goes.
  for (int i = 0; i < 1000 && !*freed; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(*freed);
  EXPECT_FALSE(server.ctx.store().find(ref->object_id));
}

TEST_F(Rdma, FetchesStayByteExactWithPacketLoss) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  std::vector<std::shared_ptr<std::vector<std::byte>>> data;
  std::vector<ObjectRef> refs;
  for (int i = 0; i < 3; ++i) {
    data.push_back(make_pattern((2u << 20) + i * 4099, 20 + i));
    refs.push_back(server.put(data.back()));
  }
  Qdisc loss("root netem loss 3%");
  std::vector<FetchRequest> reqs;
  for (const auto& r : refs) reqs.push_back(peer.fetch(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(reqs[i].wait(180s));
    EXPECT_TRUE(same_bytes(reqs[i].result().tensors[0], *data[i]));
  }
}

TEST_F(Rdma, WaitingOnStuckReadsCostsNoCpuAndTheNextFetchReconnects) {
  Server server;
  ContextOptions options = client_options("client");
  options.peer_timeout = 120s;  // the metadata channel stays up; only RoCE packets are dropped
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  std::vector<ObjectRef> refs;
  auto bytes = make_pattern(1u << 20, 30);
  for (int i = 0; i < 100; ++i) refs.push_back(server.put(bytes));
  std::vector<FetchRequest> reqs;
  {
    // Drop every UDP packet (RoCE v2 is UDP port 4791) on both veth ends; TCP still flows.
    Qdisc prio("root handle 1: prio");
    for (const char* dev : {"sr0", "sr1"}) {
      sh(std::string("tc qdisc add dev ") + dev + " parent 1:3 handle 30: netem loss 100%");
      sh(std::string("tc filter add dev ") + dev +
         " parent 1:0 protocol ip u32 match ip protocol 17 0xff flowid 1:3");
    }
    for (const auto& r : refs) reqs.push_back(peer.fetch(r));
    std::this_thread::sleep_for(500ms);  // grants arrive, READs are posted and go nowhere
    int done = 0;
    for (auto& r : reqs) done += r.done();
    ASSERT_LT(done, 100) << "fetches completed despite the dropped RoCE traffic";
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(1500ms);
    const double cpu = cpu_seconds() - cpu0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RecordProperty("idle_cpu_seconds", std::to_string(cpu));
    std::printf("waiting with %d fetches stuck: %.3f s CPU in %.3f s\n", 100 - done, cpu, wall);
    EXPECT_LT(cpu, 0.1 * wall) << "waiting for completions should sleep, not spin";
    // A link that stays down ends with the queue pair in error (rxe retries for a long time;
    // the test does not wait for it): break it now.
    EXPECT_GE(rdma::inject_queue_pair_errors(client), 1u);
  }
  // Every fetch completes (the QP gives up and fails them, or they finish): none hangs.
  int failed = 0;
  for (auto& r : reqs) {
    auto ec = r.wait(120s);
    ASSERT_NE(ec, errc::timed_out) << "a fetch hung";
    if (ec) EXPECT_EQ(scope_of(ec), Scope::peer) << ec.message();
    failed += static_cast<bool>(ec);
  }
  std::printf("after the queue pair broke: %d of 100 failed\n", failed);
  ASSERT_GT(failed, 0) << "no fetch saw the broken queue pair: reconnection was not exercised";
  // The peer is fine; a broken queue pair is replaced on the next fetch.
  auto again = peer.fetch(refs[0]);
  ASSERT_FALSE(again.wait(120s));
  EXPECT_EQ(again.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(again.result().tensors[0], *bytes));
}

}  // namespace
}  // namespace ferry::test
