// Fault injection with real processes and real links: peers SIGKILLed at random points of a
// thousand transfers, links cut and brought back, delay and loss on the TCP path. Runs over TCP
// on the host and, with the rdma. prefix, inside the soft-RoCE guest (where netem exists).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/child_process.h"
#include "tests/fault_workload.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

bool in_guest() { return test_transport() == "RDMA"; }

void expect_clean(const WorkloadReport& r, size_t min_transfers) {
  std::printf("%s\n", r.summary().c_str());
  for (const auto& p : r.problems) ADD_FAILURE() << p;
  EXPECT_GE(r.transfers(), min_transfers);
}

WorkloadOptions kill_options() {
  WorkloadOptions o;
  o.transfers = 1000;
  if (const char* n = std::getenv("FERRY_FAULT_TRANSFERS")) o.transfers = std::stoul(n);  // probes
  o.max_size = in_guest() ? (256u << 10) : (4u << 20);  // rxe under emulation: ~30 MB/s
  o.seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(o.seed));
  return o;
}

// The kill_options() workload with only the owners (`kill_owners`) or only the fetchers killed:
// every transfer clean, and enough kills of that side to mean anything.
WorkloadReport run_one_sided_kills(bool kill_owners) {
  auto o = kill_options();
  o.kill_owners = kill_owners;
  o.kill_fetchers = !kill_owners;
  const auto r = run_fault_workload(o);
  expect_clean(r, o.transfers);
  EXPECT_GT(kill_owners ? r.owner_kills : r.fetcher_kills, 5u) << "too few kills to mean anything";
  return r;
}

TEST(Faults, FetchersKilledAtRandomPointsOfAThousandTransfers) {
  FERRY_REQUIRE_TEST_HOST();
  run_one_sided_kills(false);
}

TEST(Faults, OwnersKilledAtRandomPointsOfAThousandTransfers) {
  FERRY_REQUIRE_TEST_HOST();
  const auto r = run_one_sided_kills(true);
  EXPECT_GT(r.owner_fetches_ok, 0u);
  EXPECT_LT(r.owner_fetches_ok, r.owner_fetches) << "no kill caught a fetch in flight";
}

// The soak's mix (kills of both kinds, aborts and deadlines racing completion, an honest peer)
// for a short while; `make soak` runs it for ten minutes.
TEST(Faults, ShortSoak) {
  FERRY_REQUIRE_TEST_HOST();
  auto o = kill_options();
  o.aborts = true;
  o.fetcher_children = 2;
  o.duration = std::chrono::seconds(in_guest() ? 20 : 15);
  const auto r = run_fault_workload(o);
  expect_clean(r, 1);
  EXPECT_GT(r.aborted + r.timed_out, 0u) << "no abort or deadline raced anything";
}

// ---------------------------------------------------------------- link cuts

void sh(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }

// Cuts a link for `outage` with fetches pending, brings it back, and checks: a fetch whose
// deadline falls inside the outage times out by it; one whose deadline outlasts it completes
// byte-exact; new fetches succeed once the link is back.
void cut_and_restore(Context& client, const std::string& address, const ObjectRef& ref,
                     const std::vector<std::byte>& expected, const std::function<void()>& cut,
                     const std::function<void()>& restore, std::chrono::milliseconds outage) {
  auto peer = connect_or_fail(client, address);
  ASSERT_TRUE(peer.valid());
  if (client.options().transport != "auto") {
    EXPECT_EQ(peer.transport(), client.options().transport);
  }
  auto warm = peer.fetch(ref);
  ASSERT_FALSE(warm.wait(scaled(30s)));
  cut();
  const auto t0 = std::chrono::steady_clock::now();
  auto short_deadline = peer.fetch(ref, {}, {.timeout = 1000ms});
  auto long_deadline = peer.fetch(ref, {}, {.timeout = 30s});
  auto ec = short_deadline.wait(scaled(10s));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(ec, errc::timed_out) << ec.message();
  EXPECT_GE(waited, 900ms);
  EXPECT_LT(waited, scaled(3s)) << "the deadline was not kept during the outage";
  std::this_thread::sleep_for(outage - std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - t0));
  EXPECT_FALSE(long_deadline.done()) << "a fetch completed while the link was down";
  restore();
  ec = long_deadline.wait(scaled(40s));
  ASSERT_FALSE(ec) << "a fetch whose deadline outlasted the outage failed: " << ec.message();
  EXPECT_TRUE(same_bytes(long_deadline.result().tensors[0], expected));
  ASSERT_TRUE(fetch_completes(peer, ref, expected, 30s));
}

// A cut longer than the peer timeout: the session is declared dead, its fetch fails with a peer
// error in bounded time, and once the link is back a new connection works.
void cut_past_peer_timeout(const std::string& address, const ObjectRef& ref,
                           const std::vector<std::byte>& expected, const std::string& transport,
                           const std::function<void()>& cut, const std::function<void()>& restore) {
  ContextOptions o = client_options("impatient");
  o.transport = transport;
  o.heartbeat_interval = 200ms;
  o.peer_timeout = 1500ms;
  Context client(o);
  auto peer = connect_or_fail(client, address);
  ASSERT_TRUE(peer.valid());
  cut();
  auto pending = peer.fetch(ref);
  auto ec = pending.wait(scaled(10s));
  EXPECT_EQ(ec, errc::peer_unresponsive) << ec.message();
  restore();
  auto again = client.connect(address);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(again->transport(), transport);
  auto req = again->fetch(ref);
  ASSERT_FALSE(req.wait(scaled(30s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], expected));
}

// The host has network namespaces and veth (not netem): a server process in its own namespace
// behind a veth pair, the link taken down and up on this side.
class HostLink : public ::testing::Test {
 protected:
  void SetUp() override {
    if (in_guest()) GTEST_SKIP() << "SKIPPED: the host-namespace variant runs on the host";
    if (::geteuid() != 0) GTEST_SKIP() << "SKIPPED: needs root for network namespaces";
    if (std::system("command -v ip >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "SKIPPED: needs iproute2 (ip)";
    }
    const std::string id = std::to_string(::getpid() % 100000);
    ns_ = "ferry-ns" + id;
    host_if_ = "fyh" + id;
    const std::string peer_if = "fyp" + id;
    if (std::system(("ip netns add " + ns_).c_str()) != 0) {
      ns_.clear();
      GTEST_SKIP() << "SKIPPED: cannot create a network namespace here";
    }
    sh("ip link add " + host_if_ + " type veth peer name " + peer_if);
    sh("ip link set " + peer_if + " netns " + ns_);
    sh("ip addr add 10.231.0.1/30 dev " + host_if_);
    sh("ip link set " + host_if_ + " up");
    sh("ip netns exec " + ns_ + " ip addr add 10.231.0.2/30 dev " + peer_if);
    sh("ip netns exec " + ns_ + " ip link set " + peer_if + " up");
    sh("ip netns exec " + ns_ + " ip link set lo up");
  }
  void TearDown() override {
    if (!host_if_.empty()) std::system(("ip link del " + host_if_ + " 2>/dev/null").c_str());
    if (!ns_.empty()) std::system(("ip netns del " + ns_ + " 2>/dev/null").c_str());
  }
  std::unique_ptr<ChildProcess> start_server(const std::string& size) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{size}, "ready",
        std::vector<std::string>{"ip", "netns", "exec", ns_, "env", "FERRY_TEST_HOST=10.231.0.2"});
  }
  void link(bool up) { sh("ip link set " + host_if_ + (up ? " up" : " down")); }
  std::string ns_, host_if_;
};

TEST_F(HostLink, PendingFetchesKeepTheirDeadlinesAcrossACutAndNewOnesWorkAfter) {
  auto server = start_server("3000000");
  ASSERT_TRUE(server->ready);
  const std::string address = "10.231.0.2:" + server->port;
  Context client(client_options("client"));
  cut_and_restore(
      client, address, server->refs.at(0), *make_pattern(3000000, 1), [&] { link(false); },
      [&] { link(true); }, 2500ms);
}

TEST_F(HostLink, ACutLongerThanThePeerTimeoutFailsTheSessionAndReconnectingWorks) {
  auto server = start_server("3000000");
  ASSERT_TRUE(server->ready);
  cut_past_peer_timeout(
      "10.231.0.2:" + server->port, server->refs.at(0), *make_pattern(3000000, 1), "TCP",
      [&] { link(false); }, [&] { link(true); });
}

// ---------------------------------------------------------------- netem on the TCP path (guest)

// In the soft-RoCE guest: TCP between its two veth addresses, through a netem qdisc on both
// ends. (The host kernel has no netem.)
class GuestTcpPath : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!in_guest() || test_host().empty()) {
      GTEST_SKIP() << "SKIPPED: needs netem, which only the soft-RoCE guest's kernel has (runs "
                      "there as rdma.GuestTcpPath.*)";
    }
  }
  void TearDown() override { clear(); }
  void netem(const std::string& spec) {
    clear();
    for (const char* dev : {"sr0", "sr1"}) {
      sh(std::string("tc qdisc add dev ") + dev + " root netem " + spec);
    }
  }
  void clear() {
    for (const char* dev : {"sr0", "sr1"}) {
      std::system(("tc qdisc del dev " + std::string(dev) + " root 2>/dev/null").c_str());
    }
  }
  static ContextOptions tcp_options(const std::string& name) {
    ContextOptions o = client_options(name);
    o.transport = "TCP";
    o.peer_timeout = 20s;
    return o;
  }
};

TEST_F(GuestTcpPath, DelayAndLossKeepEveryByteExact) {
  Server server({.name = "owner", .transports = {"TCP"}});
  std::mt19937_64 rng(std::random_device{}());
  std::vector<std::shared_ptr<std::vector<std::byte>>> objects;
  std::vector<ObjectRef> refs;
  for (int i = 0; i < 12; ++i) {
    objects.push_back(make_pattern(rng() % (2u << 20), 60 + i));
    refs.push_back(server.put(objects.back()));
  }
  Context client(tcp_options("client"));
  auto peer = connect_or_fail(client, server.address());
  ASSERT_EQ(peer.transport(), "TCP");
  for (const char* spec : {"delay 5ms 2ms loss 1%", "delay 2ms loss 5%"}) {
    netem(spec);
    std::vector<FetchRequest> reqs;
    for (size_t i = 0; i < refs.size(); ++i) reqs.push_back(peer.fetch(refs[i]));
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto ec = reqs[i].wait(scaled(120s));
      ASSERT_FALSE(ec) << spec << ": " << ec.message();
      EXPECT_EQ(reqs[i].result().transport, "TCP");
      EXPECT_TRUE(same_bytes(reqs[i].result().tensors[0], *objects[i])) << spec;
    }
  }
}

TEST_F(GuestTcpPath, PendingFetchesKeepTheirDeadlinesAcrossACutAndNewOnesWorkAfter) {
  Server server({.name = "owner", .transports = {"TCP"}});
  auto bytes = make_pattern(3000000, 70);
  auto ref = server.put(bytes);
  Context client(tcp_options("client"));
  cut_and_restore(
      client, server.address(), ref, *bytes, [&] { netem("loss 100%"); }, [&] { clear(); }, 2500ms);
}

TEST_F(GuestTcpPath, ACutLongerThanThePeerTimeoutFailsTheSessionAndReconnectingWorks) {
  Server server({.name = "owner", .transports = {"TCP"}});
  auto bytes = make_pattern(3000000, 71);
  auto ref = server.put(bytes);
  cut_past_peer_timeout(
      server.address(), ref, *bytes, "TCP", [&] { netem("loss 100%"); }, [&] { clear(); });
}

// The same cuts with RDMA as the data channel: netem drops the metadata connection's packets
// and the RoCE v2 ones alike.
class GuestRdmaPath : public GuestTcpPath {};

TEST_F(GuestRdmaPath, PendingFetchesKeepTheirDeadlinesAcrossACutAndNewOnesWorkAfter) {
  Server server({.name = "owner"});
  auto bytes = make_pattern(3000000, 72);
  auto ref = server.put(bytes);
  ContextOptions o = client_options("client");
  o.transport = "RDMA";
  Context client(o);
  cut_and_restore(
      client, server.address(), ref, *bytes, [&] { netem("loss 100%"); }, [&] { clear(); }, 2500ms);
}

TEST_F(GuestRdmaPath, ACutLongerThanThePeerTimeoutFailsTheSessionAndReconnectingWorks) {
  Server server({.name = "owner"});
  auto bytes = make_pattern(3000000, 73);
  auto ref = server.put(bytes);
  cut_past_peer_timeout(
      server.address(), ref, *bytes, "RDMA", [&] { netem("loss 100%"); }, [&] { clear(); });
}

}  // namespace
}  // namespace ferry::test
