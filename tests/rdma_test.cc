// RDMA on real rxe devices, inside the soft-RoCE guest (tests/softroce/ferry-vm): servers on
// rxe1 ($FERRY_RDMA_PEER_IP), clients on rxe0, RoCE v2 packets across the veth pair.
// Outside the guest every test here is skipped, loudly.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/net/stats.h"
#include "ferry/rdma/options.h"
#include "ferry/rdma/rdma.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

using rdma::RdmaGrants;

// An owner's options: its RDMA transport grants with `grants`.
ContextOptions owner_options(RdmaGrants grants) {
  ContextOptions o;
  o.name = "owner";
  o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).grants = grants;
  return o;
}

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

// Runs `commands` (tc's syntax, one a line) in one tc process: a change made to both veth ends
// takes effect on both within that process's run, not a process start apart (seconds in an
// emulated guest on a loaded host), so traffic stops, or flows again, in both directions at once.
void tc_batch(const std::vector<std::string>& commands) {
  std::string lines;
  for (const auto& c : commands) lines += c + "\\n";
  sh("printf '" + lines + "' | tc -batch -");
}

// Every RoCE v2 packet (UDP port 4791: every UDP packet here) dropped on both veth ends for the
// scope of a test; TCP, and so the metadata channel, still flows. Built with `Later`, it only
// prepares the qdiscs, and start() drops. Drops start and end on both ends together (tc_batch):
// a link that carries requests but not their responses for a while is another fault than the
// one these tests make.
struct RoceDropped {
  struct Later {};
  RoceDropped() : RoceDropped(Later{}) { start(); }
  explicit RoceDropped(Later) {
    for (const char* dev : {"sr0", "sr1"}) {
      sh(std::string("tc qdisc add dev ") + dev + " parent 1:3 handle 30: netem loss 100%");
    }
  }
  ~RoceDropped() {
    if (!started_) return;
    tc_batch({"filter del dev sr0 parent 1:0", "filter del dev sr1 parent 1:0"});
  }
  void start() {
    std::vector<std::string> filters;
    for (const char* dev : {"sr0", "sr1"}) {
      filters.push_back(std::string("filter add dev ") + dev +
                        " parent 1:0 protocol ip u32 match ip protocol 17 0xff flowid 1:3");
    }
    tc_batch(filters);
    started_ = true;
  }
  Qdisc prio{"root handle 1: prio"};
  bool started_ = false;
};

// What soft-RoCE counted on each device (its hw_counters: retries, duplicate and out-of-sequence
// requests say how the link behaved) and the kernel's last words about rxe (a WARN in its
// completer moves a queue pair to the error state), for a failure message.
std::string soft_roce_state() {
  std::string out;
  std::error_code ec;
  for (const auto& dev : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    out += dev.path().filename().string() + ":";
    for (const auto& counter :
         std::filesystem::directory_iterator(dev.path() / "ports/1/hw_counters", ec)) {
      std::ifstream in(counter.path());
      std::string value;
      if (std::getline(in, value) && value != "0") {
        out += " " + counter.path().filename().string() + "=" + value;
      }
    }
    out += "\n";
  }
  if (FILE* log = popen("dmesg 2>/dev/null | grep -iE -A12 'rxe|warning' | tail -n 40", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), log)) out += line;
    pclose(log);
  }
  return out;
}

// User-mode CPU only: where a completion loop that polls instead of sleeping spends its time.
double user_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
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
  ASSERT_FALSE(req.wait(scaled(60s)));
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
    ASSERT_FALSE(req.wait(scaled(60s)));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  }
  {
    Server server;
    Context tcp_client({.name = "tcp-client", .transports = {"TCP"}});
    auto peer = connect_or_fail(tcp_client, server.address());
    EXPECT_EQ(peer.transport(), "TCP");
    auto req = peer.fetch(server.put(bytes));
    ASSERT_FALSE(req.wait(scaled(60s)));
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
  options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).busy_poll = true;
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(5u << 20, 3);
  auto req = peer.fetch(server.put(bytes));
  ASSERT_FALSE(req.wait(scaled(60s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
}

// Registered memory shared copy-on-write with a child after fork(): a write of the parent's
// and a fetch into the same memory after it, through the same registration, must land where
// the parent sees it. The memory is the receive pool's (a region stays registered while the
// pool holds it; a caller's target is registered per fetch): the application writes into what
// a fetch handed it, gives it back, and the next fetch lands there. A kernel that copies pinned
// pages for the child at fork (the guest's) keeps that without libibverbs' protection, and the
// transport says forks are safe; on one that does not, the parent's write moves it to new
// pages, the fetch lands in the child's, and this test fails (as it should:
// FERRY_RDMA_FORK_PROTECTION=1 is the remedy there).
TEST_F(Rdma, AFetchIntoRegisteredMemoryAfterAForkLandsWhereTheParentSeesIt) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  constexpr size_t kBytes = 4u << 20;
  auto first = make_pattern(kBytes, 21);
  auto second = make_pattern(kBytes, 22);
  std::optional<FetchRequest> held(peer.fetch(server.put(first)));  // into the receive pool
  ASSERT_FALSE(held->wait(scaled(60s)));
  ASSERT_TRUE(same_bytes(held->result().tensors.at(0), *first));
  std::byte* const at = held->result().tensors.at(0).data();
  const auto registered = rdma::registration_counters(client)->registrations;

  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Holds the pages until the parent closes the pipe (or at most 120 s), touching nothing.
    ::close(gate[1]);
    ::alarm(120);
    char c;
    while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  ::close(gate[0]);
  std::memset(at, 0, kBytes);  // the parent writes first
  held.reset();                // and gives the memory back to the pool
  auto req = peer.fetch(server.put(second));
  const auto ec = req.wait(scaled(60s));
  ::close(gate[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_EQ(req.result().tensors.at(0).data(), at)
      << "the pool handed out other memory: the case a fork breaks was not tried";
  EXPECT_EQ(rdma::registration_counters(client)->registrations, registered)
      << "the second fetch registered its memory again: the case a fork breaks was not tried";
  EXPECT_TRUE(same_bytes(req.result().tensors.at(0), *second))
      << "the fetch after fork() landed in pages the parent no longer sees";
  EXPECT_EQ(transport_metric(client, rdma::kRdmaTransportName, "fork_safe"), 1.0);
  EXPECT_EQ(transport_metric(server.ctx, rdma::kRdmaTransportName, "fork_safe"), 1.0);
}

// The registration cache, with grants that use it (region rkeys; windows use it the same way).
TEST_F(Rdma, TenThousandViewsOfOneAllocationCostOneRegistration) {
  Server server(owner_options(RdmaGrants::regions));
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
    ASSERT_FALSE(reqs[k].wait(scaled(60s))) << "view " << sample[k];
    ASSERT_TRUE(same_bytes(reqs[k].result().tensors[0], all.subspan(sample[k] * kView, kView)));
  }
  auto c = rdma::registration_counters(server.ctx);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->registrations, 1u) << "every view should share the slab's registration";
  EXPECT_EQ(c->live, 1u);
  // Each distinct view looks its registration up once (repeat fetches reuse the object's).
  EXPECT_EQ(c->hits, std::set<size_t>(sample.begin(), sample.end()).size() - 1);
  // The same counters in the stats snapshot and the text a scraper reads.
  const auto text = prometheus_text(server.ctx.stats());
  EXPECT_NE(text.find("\nferry_rdma_registrations_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nferry_rdma_registrations_live 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nferry_rdma_registration_hits_total " + std::to_string(c->hits) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nferry_rdma_queue_pairs " + std::to_string(c->queue_pairs) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE ferry_rdma_registration_seconds_total counter\n"), std::string::npos);
  for (const auto& ref : refs) server.ctx.release(ref);
  // The last object's collection deregisters the slab (after the releases of the leases).
  eventually([&] { return rdma::registration_counters(server.ctx)->live == 0; });
  EXPECT_EQ(rdma::registration_counters(server.ctx)->live, 0u);
  EXPECT_EQ(rdma::registration_counters(server.ctx)->deregistrations, 1u);
}

// An abort while READs are posted: the owner hears of it only once they have drained, so its
// grant (revoked when the lease ends) is not revoked under them, and the other fetches on the
// queue pair carry on.
TEST_F(Rdma, AnAbortMidReadLeavesTheOtherFetchesOnTheQueuePairAlone) {
  Server server;  // the default grants: per-grant registrations on rxe, windows on a NIC
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto big = make_pattern(16u << 20, 81);
  auto other = make_pattern(8u << 20, 82);
  auto big_ref = server.put(big);
  auto other_ref = server.put(other);
  ASSERT_FALSE(peer.fetch(other_ref).wait(scaled(60s)));  // the queue pair is up
  // The abort must land while the victim's READs are under way (16 MiB takes ~0.5 s on rxe); a
  // test thread descheduled that long sees it finish first, and the round is tried again.
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    auto victim = peer.fetch(big_ref);
    auto bystander = peer.fetch(other_ref);
    // Granted, READs posted: some of them have completed.
    ASSERT_TRUE(eventually([&] { return victim.bytes_landed() > 0 || victim.done(); }, 60s));
    victim.abort();
    const auto victim_ec = victim.wait(scaled(60s));
    auto ec = bystander.wait(scaled(60s));
    ASSERT_FALSE(ec) << "a fetch beside the aborted one failed: " << ec.message();
    EXPECT_TRUE(same_bytes(bystander.result().tensors[0], *other));
    if (victim_ec == errc::aborted) return;
    ASSERT_FALSE(victim_ec) << "the victim failed otherwise: " << victim_ec.message();
  }
  GTEST_SKIP() << "SKIPPED: in " << kRounds << " rounds the 16 MiB fetch ended before its abort "
               << "took effect (a starved machine): the test proves nothing here";
}

TEST_F(Rdma, LeaseKeepsMemoryAliveUntilTheReadEnds) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  // The owner's release must come while the READ is under way (24 MiB takes ~1 s on rxe); a test
  // thread descheduled that long sees it finish first, and the round is tried again.
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    auto bytes = make_pattern(24u << 20, 11);
    auto expected = *bytes;
    auto freed = std::make_shared<std::atomic<bool>>(false);
    // The owner's memory tells us when it is released.
    std::shared_ptr<void> owner(new std::shared_ptr<std::vector<std::byte>>(bytes),
                                [freed](void* p) {
                                  delete static_cast<std::shared_ptr<std::vector<std::byte>>*>(p);
                                  *freed = true;
                                });
    auto ref = server.ctx.put({Tensor::bytes(*bytes)}, owner);
    ASSERT_TRUE(ref.ok());
    owner.reset();
    bytes.reset();
    auto req = peer.fetch(*ref);
    // Wait until the owner has granted (the lease pins the object), then drop its last reference.
    ASSERT_TRUE(eventually(
        [&] { return server.ctx.store().counts(ref->object_id)->pins > 0 || req.done(); }, 20s));
    EXPECT_TRUE(server.ctx.release(*ref));
    // Freed only after the fetch completed: the fetcher's release, sent once its READs ended,
    // ends the lease.
    const bool freed_at_release = *freed;
    const bool done_at_release = req.done();
    EXPECT_FALSE(freed_at_release && !done_at_release)
        << "memory freed while a READ may still touch it";
    ASSERT_FALSE(req.wait(scaled(120s)));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], expected));
    // The fetcher's release ends the lease; then the object is collected and the memory goes.
    EXPECT_TRUE(eventually([&] { return freed->load(); }, 5s));
    EXPECT_FALSE(server.ctx.store().find(ref->object_id));
    if (!done_at_release) return;  // released while the READ went on
  }
  GTEST_SKIP() << "SKIPPED: in " << kRounds << " rounds the 24 MiB READ ended before the "
               << "owner's release (a starved machine): the test proves nothing here";
}

TEST_F(Rdma, FetchesStayByteExactWithPacketLoss) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  PutPatterns puts;
  for (int i = 0; i < 3; ++i) puts.put(server, (2u << 20) + i * 4099, 20 + i);
  Qdisc loss("root netem loss 3%");
  std::vector<FetchRequest> reqs;
  for (const auto& r : puts.refs) reqs.push_back(peer.fetch(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(reqs[i].wait(scaled(180s)));
    EXPECT_TRUE(same_bytes(reqs[i].result().tensors[0], *puts.data[i]));
  }
}

TEST_F(Rdma, WaitingOnStuckReadsCostsNoCpuAndTheyStartAgainOnANewQueuePair) {
  Server server;
  ContextOptions options = client_options("client");
  options.peer_timeout = 120s;  // the metadata channel stays up; only RoCE packets are dropped
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  std::vector<ObjectRef> refs;
  auto bytes = make_pattern(1u << 20, 30);
  for (int i = 0; i < 100; ++i) refs.push_back(server.put(bytes));
  std::vector<FetchRequest> reqs;
  int done = 0;  // before the queue pair breaks
  {
    RoceDropped dropped;
    for (const auto& r : refs) reqs.push_back(peer.fetch(r));
    std::this_thread::sleep_for(500ms);  // grants arrive, READs are posted and go nowhere
    for (auto& r : reqs) done += r.done();
    ASSERT_LT(done, 100) << "fetches completed despite the dropped RoCE traffic";
    const double cpu0 = cpu_seconds();
    const double user0 = user_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(1500ms);
    const double cpu = cpu_seconds() - cpu0;
    const double user = user_cpu_seconds() - user0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RecordProperty("idle_cpu_seconds", std::to_string(cpu));
    std::printf("waiting with %d fetches stuck: %.3f s CPU (%.3f s of it user) in %.3f s\n",
                100 - done, cpu, user, wall);
    // A wait that polls instead of sleeping costs a whole core in user mode (the completion
    // queue is a ring in user memory). The kernel's share is rxe retrying the dropped READs, in
    // softirqs charged to whoever runs: measured at 0.3 to 1.3 s of these 1.5 s on a guest
    // whose host was busy, and not ferry's to bound, so it is printed, not asserted.
    EXPECT_LT(user, std::min(0.1 * time_scale(), 0.5) * wall)
        << "waiting for completions should sleep, not spin";
    // A link that stays down ends with the queue pair in error (rxe retries for a long time;
    // the test does not wait for it): break it now.
    EXPECT_GE(rdma::inject_queue_pair_errors(client), 1u);
  }
  // The peer lives: every fetch the broken queue pair held starts again over a new pair, and
  // all of them arrive, byte-exact; none hangs, none fails.
  uint32_t restarts = 0;
  int restarted = 0;
  for (auto& r : reqs) {
    ASSERT_FALSE(r.wait(scaled(120s))) << "a fetch over the broken queue pair failed or hung";
    EXPECT_EQ(r.result().transport, "RDMA");
    EXPECT_TRUE(same_bytes(r.result().tensors[0], *bytes))
        << "fetch " << r.id() << " (started " << r.result().restarts + 1
        << " times): " << describe_difference(r.result().tensors[0], *bytes);
    restarts += r.result().restarts;
    restarted += r.result().restarts > 0;
  }
  std::printf("after the queue pair broke: %d of 100 fetches started again (%u restarts)\n",
              restarted, restarts);
  EXPECT_EQ(restarted, 100 - done) << "each fetch stuck on the broken pair starts again";
  if (HasFailure()) std::printf("soft-RoCE:\n%s", soft_roce_state().c_str());
  // The peer is fine; a new fetch uses the new queue pair.
  auto again = peer.fetch(refs[0]);
  ASSERT_FALSE(again.wait(scaled(120s)));
  EXPECT_EQ(again.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(again.result().tensors[0], *bytes));
}

// The owner's side of the queue pair goes first: it ends the leases of the fetches on it and
// tells the fetcher (a reset, then an error per lease, on the metadata channel). The fetcher
// fails its own side when it reads the reset, before those errors, so every fetch starts again
// over a new pair instead of failing with its lease's error.
TEST_F(Rdma, AQueuePairBrokenAtTheOwnerRestartsTheFetchesOnIt) {
  Server server;
  ContextOptions options = client_options("client");
  options.peer_timeout = 120s;
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  constexpr int kFetches = 50;
  auto bytes = make_pattern(256u << 10, 31);
  std::vector<ObjectRef> refs;
  for (int i = 0; i < kFetches; ++i) refs.push_back(server.put(bytes));
  std::vector<FetchRequest> reqs;
  int done = 0;
  {
    RoceDropped dropped;  // the READs wait on the owner's leases
    for (const auto& r : refs) reqs.push_back(peer.fetch(r));
    std::this_thread::sleep_for(500ms);
    for (auto& r : reqs) done += r.done();
    ASSERT_LT(done, kFetches) << "fetches completed despite the dropped RoCE traffic";
    EXPECT_EQ(rdma::inject_queue_pair_errors(server.ctx), 1u);
    std::this_thread::sleep_for(300ms);  // the reset and the leases' errors reach the fetcher
  }
  int restarted = 0;
  for (auto& r : reqs) {
    ASSERT_FALSE(r.wait(scaled(120s)))
        << "a fetch failed with the owner's end of its lease, or hung";
    EXPECT_EQ(r.result().transport, "RDMA");
    EXPECT_TRUE(same_bytes(r.result().tensors[0], *bytes));
    restarted += r.result().restarts > 0;
  }
  std::printf("the owner's queue pair broke: %d of %d fetches started again\n", restarted,
              kFetches);
  EXPECT_EQ(restarted, kFetches - done) << "each fetch on the broken pair starts again";
}

// A fetch whose queue pair breaks after some of its READs completed goes on over a new pair from
// the first byte it lacks, instead of reading the object whole again (rxe has been seen to stall
// a pair again and again under load, each time past the half of a 1 GiB object, which no number
// of restarts from the start gets through). The RoCE traffic stops once some bytes have landed,
// which fixes what has; then the owner's bytes change (a user error, here the witness) and the
// fetcher's pair is broken: the bytes that had landed keep the old values, every other byte has
// the new ones.
TEST_F(Rdma, AFetchWhosePairBrokeGoesOnFromTheFirstByteItLacks) {
  Server server;
  ContextOptions options = client_options("client");
  options.peer_timeout = 120s;
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  constexpr size_t kBytes = 128u << 20;
  // The traffic must stop while the READs are under way (128 MiB takes seconds on rxe); a test
  // thread descheduled that long sees the fetch end first, and the round is tried again.
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    auto bytes = make_pattern(kBytes, 41);
    const auto before = *bytes;
    const ObjectRef ref = server.put(bytes);
    std::vector<std::byte> target(kBytes);
    uint64_t kept = 0;
    FetchRequest req;
    {
      RoceDropped dropped{RoceDropped::Later{}};
      req = peer.fetch(ref, {target});
      ASSERT_TRUE(eventually([&] { return req.bytes_landed() >= (2u << 20) || req.done(); }, 60s));
      dropped.start();
      std::this_thread::sleep_for(200ms);  // responses already on their way have arrived
      kept = req.bytes_landed();
      if (kept == kBytes) {
        ASSERT_FALSE(req.wait(scaled(60s))) << req.wait(0s).message();
        EXPECT_TRUE(server.ctx.release(ref));
        continue;
      }
      auto after = make_pattern(kBytes, 42);
      std::memcpy(bytes->data(), after->data(), kBytes);
      EXPECT_EQ(rdma::inject_queue_pair_errors(client), 1u);
      std::this_thread::sleep_for(300ms);
      EXPECT_EQ(req.bytes_landed(), kept) << "bytes landed after the traffic stopped";
    }
    ASSERT_FALSE(req.wait(scaled(120s))) << req.wait(0s).message();
    EXPECT_EQ(req.result().transport, "RDMA");
    EXPECT_GE(req.result().restarts, 1u);
    EXPECT_EQ(std::memcmp(target.data(), before.data(), kept), 0)
        << "bytes that had landed were read again";
    EXPECT_EQ(std::memcmp(target.data() + kept, bytes->data() + kept, kBytes - kept), 0)
        << "the bytes after the first " << kept << " are not the object's";
    std::printf("%llu of %zu bytes had landed when the pair broke (round %d)\n",
                static_cast<unsigned long long>(kept), kBytes, round + 1);
    return;
  }
  GTEST_SKIP() << "SKIPPED: in " << kRounds << " rounds the 128 MiB fetch ended before its "
               << "traffic could be stopped (a starved machine): the test proves nothing here";
}

// A device that goes on working but loses the completions of the READs outstanding (rxe under
// load): two seconds without a completion, a probe READ of one byte completes where they did
// not, which ends the pair long before the stall bound (the peer timeout), and the fetch goes on
// over a new pair from the bytes whose READs did complete.
TEST_F(Rdma, AFetchWhoseReadsTheDeviceNeverCompletesGoesOnOverANewPair) {
  Server server;
  ContextOptions options = client_options("client");
  options.peer_timeout = scaled(20s);
  Context client(options);
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(32u << 20, 43);
  const ObjectRef ref = server.put(bytes);
  rdma::lose_read_completions_after(client, 4);
  std::vector<std::byte> target(bytes->size());
  const auto started = std::chrono::steady_clock::now();
  auto req = peer.fetch(ref, {target});
  ASSERT_FALSE(req.wait(scaled(120s))) << req.wait(0s).message();
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, options.peer_timeout) << "the stall bound ended the pair, not the probe";
  EXPECT_EQ(req.result().transport, "RDMA");
  EXPECT_EQ(req.result().restarts, 1u);
  EXPECT_TRUE(same_bytes(target, *bytes));
}

// Options whose peer timeout is short next to `delay`: a side whose io thread stood still for
// `delay` would be declared dead by the other.
ContextOptions impatient(ContextOptions o, std::chrono::milliseconds delay) {
  o.heartbeat_interval = delay / 12;
  o.peer_timeout = delay / 3;
  return o;
}

// A fetch whose targets take long to register (as many GiB do) registers them off the io
// thread: the peers keep hearing from each other, and a fetch into memory registered already
// (the receive pool's) completes meanwhile.
TEST_F(Rdma, TargetsThatTakeLongToRegisterStallNeitherThePeerNorOtherFetches) {
  const auto delay = scaled(5s);
  Server server(impatient({}, delay));
  Context client(impatient(client_options("client"), delay));
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(8u << 20, 44);
  const ObjectRef ref = server.put(bytes);
  // Warms the receive pool: its region is made and registered before registrations slow down.
  ASSERT_FALSE(peer.fetch(ref).wait(scaled(60s)));
  rdma::slow_registrations(client, delay);
  std::vector<std::byte> target(bytes->size());
  const auto started = std::chrono::steady_clock::now();
  auto slow = peer.fetch(ref, {target});
  auto pooled = peer.fetch(ref);  // into the pool's region, registered already
  ASSERT_FALSE(pooled.wait(scaled(60s))) << pooled.wait(0s).message();
  EXPECT_FALSE(slow.done()) << "the slow registration did not hold its fetch back";
  EXPECT_TRUE(same_bytes(pooled.result().tensors.at(0), *bytes));
  ASSERT_FALSE(slow.wait(scaled(120s))) << slow.wait(0s).message();
  EXPECT_GE(std::chrono::steady_clock::now() - started, delay);
  EXPECT_EQ(slow.result().transport, "RDMA");
  EXPECT_EQ(slow.result().restarts, 0u);
  EXPECT_TRUE(same_bytes(target, *bytes));
  rdma::slow_registrations(client, 0ms);
  auto again = peer.fetch(ref);
  EXPECT_FALSE(again.wait(scaled(60s))) << "the peer did not survive the registration";
}

// The owner's side of the same: the memory a grant needs is registered off the owner's io
// thread (with per-grant registrations, rxe's default, at every grant), and the fetcher, whose
// peer timeout is far shorter, keeps hearing from it.
TEST_F(Rdma, AGrantThatTakesLongToRegisterLeavesTheOwnerResponsive) {
  for (RdmaGrants grants : {RdmaGrants::registrations, RdmaGrants::regions}) {
    SCOPED_TRACE(grants == RdmaGrants::regions ? "regions" : "registrations");
    const auto delay = scaled(5s);
    Server server(impatient(owner_options(grants), delay));
    Context client(impatient(client_options("client"), delay));
    auto peer = connect_or_fail(client, server.address());
    auto bytes = make_pattern(8u << 20, 45);
    const ObjectRef ref = server.put(bytes);
    rdma::slow_registrations(server.ctx, delay);
    std::vector<std::byte> target(bytes->size());
    const auto started = std::chrono::steady_clock::now();
    auto req = peer.fetch(ref, {target});
    ASSERT_FALSE(req.wait(scaled(120s))) << req.wait(0s).message();
    EXPECT_GE(std::chrono::steady_clock::now() - started, delay);
    EXPECT_EQ(req.result().restarts, 0u);
    EXPECT_TRUE(same_bytes(target, *bytes));
  }
}

// A small object inside memory the owner is registering for another object's serve waits for
// that registration off the owner's io thread (not on it, as a small registration otherwise
// would): meanwhile the owner serves an object registered already at once, and the fetcher,
// whose peer timeout is far shorter than the registration, keeps hearing from it.
TEST_F(Rdma, ASmallServeInsideMemoryBeingRegisteredWaitsOffTheOwnersIoThread) {
  const auto delay = scaled(5s);
  Server server(impatient(owner_options(RdmaGrants::regions), delay));
  Context client(impatient(client_options("client"), delay));
  auto peer = connect_or_fail(client, server.address());
  auto big = make_pattern(8u << 20, 47);
  auto other = make_pattern(4096, 48);
  const ObjectRef big_ref = server.put(big);
  const ObjectRef other_ref = server.put(other);
  // A page of `big`, put as an object of its own: its registration would cover pages that
  // big's does.
  const auto inner = std::span<const std::byte>(*big).subspan(3 * 4096, 4096);
  auto inner_ref = server.ctx.put({Tensor::bytes(inner)}, big);
  ASSERT_TRUE(inner_ref.ok());
  ASSERT_FALSE(peer.fetch(other_ref).wait(scaled(60s)));  // registered before the slow-down
  rdma::slow_registrations(server.ctx, delay);
  auto big_fetch = peer.fetch(big_ref);
  // The owner's registration of `big` is under way once its request has reached it.
  std::this_thread::sleep_for(delay / 5);
  auto inner_fetch = peer.fetch(*inner_ref);
  auto other_fetch = peer.fetch(other_ref);
  ASSERT_FALSE(other_fetch.wait(delay / 3)) << other_fetch.wait(0s).message();
  EXPECT_FALSE(big_fetch.done()) << "the owner's registration did not hold its serve back";
  EXPECT_TRUE(same_bytes(other_fetch.result().tensors.at(0), *other));
  ASSERT_FALSE(big_fetch.wait(scaled(120s))) << big_fetch.wait(0s).message();
  ASSERT_FALSE(inner_fetch.wait(scaled(120s))) << inner_fetch.wait(0s).message();
  EXPECT_EQ(big_fetch.result().restarts, 0u);
  EXPECT_TRUE(same_bytes(big_fetch.result().tensors.at(0), *big));
  EXPECT_TRUE(same_bytes(inner_fetch.result().tensors.at(0), inner));
}

// An abort, and a context's close, do not wait for a registration under way; the registration
// is let go once it is made (no registration is left behind).
TEST_F(Rdma, AFetchWhoseTargetsAreBeingRegisteredAbortsAtOnce) {
  const auto delay = scaled(6s);
  Server server;
  auto bytes = make_pattern(8u << 20, 46);
  const ObjectRef ref = server.put(bytes);
  {
    Context client(client_options("client"));
    auto peer = connect_or_fail(client, server.address());
    ASSERT_FALSE(peer.fetch(ref).wait(scaled(60s)));  // the queue pair is up, the pool warm
    const uint64_t live_before = rdma::registration_counters(client)->live;
    rdma::slow_registrations(client, delay);
    std::vector<std::byte> target(bytes->size());
    auto req = peer.fetch(ref, {target});
    std::this_thread::sleep_for(delay / 6);
    const auto aborted_at = std::chrono::steady_clock::now();
    req.abort();
    EXPECT_EQ(req.wait(scaled(60s)), errc::aborted);
    EXPECT_LT(std::chrono::steady_clock::now() - aborted_at, delay / 3)
        << "the abort waited for the registration";
    EXPECT_TRUE(eventually([&] { return rdma::registration_counters(client)->live == live_before; },
                           2 * delay))
        << "the aborted fetch's registration was kept";
    // Closed with a registration under way: the close ends the fetch and waits for the
    // registration to come back (within its own bound of 5 s), which lets it go.
    rdma::slow_registrations(client, 2s);
    std::vector<std::byte> other(bytes->size());
    auto in_flight = peer.fetch(ref, {other});
    std::this_thread::sleep_for(200ms);
    client.close();
    EXPECT_TRUE(in_flight.done());
    EXPECT_TRUE(in_flight.wait(0s)) << "a fetch the close ended succeeded";
    EXPECT_LE(rdma::registration_counters(client)->live, live_before)
        << "the closed fetch's registration was kept";
  }
}

// A registration that outlasts its context's close (which waits for the loop's work 5 s at most)
// is dropped on the registrar thread once made: the context (its store, loop and sessions) goes
// then, instead of being held for good by a post-back into a loop that never runs again.
TEST_F(Rdma, ARegistrationThatOutlastsTheContextsCloseLetsTheContextGo) {
  const auto delay = scaled(5s) + 5s;  // beyond the close's bound
  Server server;
  auto bytes = make_pattern(8u << 20, 49);
  const ObjectRef ref = server.put(bytes);
  std::weak_ptr<std::vector<std::byte>> stored;  // an object of the closing context's store
  std::vector<std::byte> target(bytes->size());
  FetchRequest in_flight;
  std::chrono::steady_clock::time_point registered_by;
  {
    Context client(client_options("client"));
    auto kept = make_pattern(4096, 50);
    ASSERT_TRUE(client.put({Tensor::bytes(*kept)}, kept).ok());
    stored = kept;
    kept.reset();
    auto peer = connect_or_fail(client, server.address());
    ASSERT_FALSE(peer.fetch(ref).wait(scaled(60s)));  // the queue pair is up
    rdma::slow_registrations(client, delay);
    registered_by = std::chrono::steady_clock::now() + delay;
    in_flight = peer.fetch(ref, {target});
    std::this_thread::sleep_for(200ms);  // its registration is under way
  }
  const bool outlasted = std::chrono::steady_clock::now() < registered_by;
  EXPECT_TRUE(in_flight.done());
  EXPECT_TRUE(in_flight.wait(0s)) << "a fetch the close ended succeeded";
  EXPECT_TRUE(eventually([&] { return stored.expired(); }, 3 * delay))
      << "the closed context was never freed: its registration's post-back holds it";
  if (!outlasted) {
    GTEST_SKIP() << "SKIPPED: the close took longer than the registration (a loaded machine): "
                    "nothing outlasted it";
  }
}

// kFetches fetches of 2 MiB each over one queue pair, into targets of their own (8 MiB in all:
// every READ of every fetch is posted at once, RdmaChannel's pipe bound), each completion handler
// reading the fetcher's queue-pair gauge. For the tests of what may end a fetch while its READs
// are posted: rxe may go on placing the responses a pair took in until the pair is destroyed, so
// such a fetch must complete (handing its targets back) only after that.
struct LandingFetches {
  static constexpr int kFetches = 4;
  static constexpr size_t kBytes = 2u << 20;
  static constexpr auto kSentinel = std::byte{0xEE};

  // The fetcher's options: a quiesce bound far beyond any destroy's time on a busy machine, so
  // that a completion before the pair is gone is the transport's doing, never the bound's.
  static ContextOptions fetcher_options(const std::string& name) {
    ContextOptions options = client_options(name);
    options.peer_timeout = 120s;
    options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).quiesce_timeout =
        scaled(60s);
    return options;
  }

  LandingFetches(Server& server, Context& client, Peer& peer, int seed)
      : server(server), client(client), peer(peer), bytes(make_pattern(kBytes, seed)) {}

  // Brings the pair up, then stops the RoCE traffic (`dropped`) and starts the fetches: their
  // grants arrive (the metadata channel is TCP) and their READs are posted, where they can
  // neither complete nor fail until the test ends them. With the traffic flowing, a fetch whose
  // READs drained between the test's abort or close and the pair's failure completed with the
  // pair still there, as it should: the test could not tell that from the bug.
  void start(std::optional<RoceDropped>& dropped) {
    for (int i = 0; i < kFetches; ++i) refs.push_back(server.put(bytes));
    ASSERT_FALSE(peer.fetch(refs[0]).wait(scaled(60s)));  // the queue pair is up
    ASSERT_EQ(rdma::registration_counters(client)->queue_pairs, 1u);
    dropped.emplace();
    for (int i = 0; i < kFetches; ++i) {
      pairs_at_completion[i] = -1;
      reqs.push_back(peer.fetch(refs[i], {MutableBuffer(targets[i])}, {},
                                FetchHandler([this, i](boost::system::error_code, FetchResult) {
                                  pairs_at_completion[i] = static_cast<int>(
                                      rdma::registration_counters(client)->queue_pairs);
                                })));
    }
    std::this_thread::sleep_for(scaled(300ms));
    int running = 0;
    for (auto& r : reqs) running += !r.done();
    ASSERT_EQ(running, kFetches) << "fetches ended with the RoCE traffic stopped";
  }

  // Waits for every fetch to end with `ec` (none can succeed with the traffic stopped). Those
  // that ended get their targets back: filled with kSentinel, as a caller reusing them would;
  // their indices go to `ended`.
  void wait_ended_with(std::error_code ec, std::vector<int>& ended) {
    for (int i = 0; i < kFetches; ++i) {
      const auto got = reqs[i].wait(scaled(60s));
      ASSERT_TRUE(reqs[i].done()) << "fetch " << i << " did not end";
      EXPECT_EQ(got, ec) << "fetch " << i;
      if (!got) continue;
      std::fill(targets[i].begin(), targets[i].end(), kSentinel);
      ended.push_back(i);
    }
    ASSERT_FALSE(ended.empty()) << "no fetch ended with " << ec.message();
  }

  // Each of `ended` completed after its pair was gone (gauge 0), and nothing was written into
  // its target after it completed, with the RoCE traffic flowing again (`dropped` reset): a pair
  // still there would go on with the READs it had posted.
  void expect_quiet_at_completion(const std::vector<int>& ended,
                                  std::optional<RoceDropped>& dropped) {
    for (int i = 0; i < 200 && pairs_at_completion[ended.back()] < 0; ++i) {
      std::this_thread::sleep_for(10ms);  // the handler runs after wait() has returned
    }
    dropped.reset();
    std::this_thread::sleep_for(scaled(1s));
    for (int i : ended) {
      EXPECT_EQ(pairs_at_completion[i], 0)
          << "fetch " << i << " completed while its queue pair still existed";
      const auto wrong = std::count_if(targets[i].begin(), targets[i].end(),
                                       [&](std::byte b) { return b != kSentinel; });
      EXPECT_EQ(wrong, 0) << "fetch " << i << ": bytes written into its target after it completed";
    }
  }

  Server& server;
  Context& client;
  Peer& peer;
  std::shared_ptr<std::vector<std::byte>> bytes;
  std::vector<ObjectRef> refs;
  std::vector<std::vector<std::byte>> targets =
      std::vector<std::vector<std::byte>>(kFetches, std::vector<std::byte>(kBytes));
  std::vector<std::atomic<int>> pairs_at_completion = std::vector<std::atomic<int>>(kFetches);
  std::vector<FetchRequest> reqs;
};

// Fetches aborted while their READs are posted, then their queue pair broken before the READs
// drained: each completes only once the pair is destroyed. Completed at once, as before, every
// handler saw the pair still there (1), in 3 of 3 runs in the 6.12 guest; the stale writes
// themselves never showed in this test's targets.
TEST_F(Rdma, FetchesAbortedOnABrokenPairHandTheirTargetsBackOnlyOnceItIsQuiet) {
  Server server;
  Context client(LandingFetches::fetcher_options("client"));
  auto peer = connect_or_fail(client, server.address());
  LandingFetches f(server, client, peer, 33);
  std::optional<RoceDropped> dropped;
  ASSERT_NO_FATAL_FAILURE(f.start(dropped));
  for (auto& r : f.reqs) r.abort();
  EXPECT_EQ(rdma::inject_queue_pair_errors(client), 1u);
  std::vector<int> aborted;
  ASSERT_NO_FATAL_FAILURE(f.wait_ended_with(errc::aborted, aborted));
  f.expect_quiet_at_completion(aborted, dropped);
  std::printf("%zu of %d fetches aborted on the broken pair\n", aborted.size(), f.kFetches);
  // The next fetch sets up a new pair and lands whole.
  auto again = peer.fetch(f.refs[0]);
  ASSERT_FALSE(again.wait(scaled(60s)));
  EXPECT_TRUE(same_bytes(again.result().tensors[0], *f.bytes));
}

// The same when the fetcher closes the peer while the READs are landing: the session's close
// completes the fetches with peer_closed only once the queue pair is destroyed
// (TransportManager::when_quiet), not as it closes the channel. Completed as it closed the
// channel, as before, every handler saw the pair (1) in 1 of 3 guest runs.
TEST_F(Rdma, FetchesInFlightWhenTheirPeerClosesCompleteOnlyOnceTheirQueuePairIsGone) {
  Server server;
  auto client = std::make_unique<Context>(LandingFetches::fetcher_options("client"));
  auto peer = connect_or_fail(*client, server.address());
  LandingFetches f(server, *client, peer, 34);
  std::optional<RoceDropped> dropped;
  ASSERT_NO_FATAL_FAILURE(f.start(dropped));
  peer.close();
  std::vector<int> closed;
  ASSERT_NO_FATAL_FAILURE(f.wait_ended_with(errc::peer_closed, closed));
  f.expect_quiet_at_completion(closed, dropped);
  std::printf("%zu of %d fetches ended by the close\n", closed.size(), f.kFetches);
  // A new connection to the same owner fetches over a new pair, whole.
  auto again = connect_or_fail(*client, server.address());
  auto r = again.fetch(f.refs[0]);
  ASSERT_FALSE(r.wait(scaled(60s)));
  EXPECT_EQ(r.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(r.result().tensors[0], *f.bytes));
  // The closed pair's bound (5 s from the close) was cancelled once the pair was destroyed: the
  // context closes without waiting for it.
  const auto t0 = std::chrono::steady_clock::now();
  client.reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  std::printf("the context closed in %.3f s\n", std::chrono::duration<double>(took).count());
  EXPECT_LT(took, std::min<std::chrono::nanoseconds>(scaled(1s), 2500ms))
      << "closing the context waited for the closed queue pair's bound";
}

// ---------------------------------------------------------------- memory in chunks

// `o` with RDMA registrations of at most `chunk` bytes each (RdmaOptions::max_registration).
ContextOptions with_chunks(ContextOptions o, size_t chunk) {
  o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).max_registration = chunk;
  return o;
}

uint64_t chunks_of(size_t bytes, size_t chunk) { return (bytes + chunk - 1) / chunk; }

class RdmaChunks : public Rdma, public ::testing::WithParamInterface<RdmaGrants> {};

// An owner that registers at most 1 MiB at a time and a fetcher that registers at most 768 KiB:
// two views of one 7 MiB allocation, put with it as their region, at offsets no chunk boundary
// of either side falls on, and an object of its own, fetched into targets at odd offsets of one
// allocation and into ferry's memory. A READ that crossed a registration of either side would
// fail with a protection or remote access error; every byte arrives, over RDMA, with each grant
// mode the owner can use.
TEST_P(RdmaChunks, MemoryLargerThanARegistrationIsReadInPieces) {
  constexpr size_t kOwnerChunk = 1u << 20;
  constexpr size_t kFetcherChunk = 768u << 10;
  Server server(with_chunks(owner_options(GetParam()), kOwnerChunk));
  Context client(with_chunks(client_options("client"), kFetcherChunk));
  auto peer = connect_or_fail(client, server.address());
  auto memory = make_pattern((7u << 20) + 333, 61);
  const std::span<const std::byte> all(*memory);
  const auto a = all.subspan(100, (3u << 20) + 17);
  const auto b = all.subspan((3u << 20) + 500);
  PutOptions in_region;
  in_region.region = all;
  auto views = server.ctx.put({Tensor::bytes(a), Tensor::bytes(b)}, memory, in_region);
  ASSERT_TRUE(views.ok());
  auto own = make_pattern((5u << 20) + 1, 62);
  const ObjectRef alone = server.put(own);
  const auto owner_before = rdma::registration_counters(server.ctx)->registrations;
  const auto fetcher_before = rdma::registration_counters(client)->registrations;

  std::vector<std::byte> landing(9u << 20);
  const MutableBuffer ta(landing.data() + 77, a.size());
  const MutableBuffer tb(landing.data() + (4u << 20) + 3, b.size());
  auto into = peer.fetch(*views, {ta, tb});
  ASSERT_FALSE(into.wait(scaled(120s))) << into.wait(0s).message();
  EXPECT_EQ(into.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(ta, a));
  EXPECT_TRUE(same_bytes(tb, b));
  // The targets were registered in chunks: at least as many registrations as chunks they span.
  EXPECT_GE(rdma::registration_counters(client)->registrations - fetcher_before,
            chunks_of(a.size(), kFetcherChunk) + chunks_of(b.size(), kFetcherChunk));

  auto fresh = peer.fetch(alone);
  ASSERT_FALSE(fresh.wait(scaled(120s))) << fresh.wait(0s).message();
  EXPECT_EQ(fresh.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(fresh.result().tensors[0], *own));
  // The owner's side in chunks too: the region (or, per grant, each view) and the object.
  const auto owner_made = rdma::registration_counters(server.ctx)->registrations - owner_before;
  const uint64_t owner_least =
      GetParam() == RdmaGrants::registrations
          ? chunks_of(a.size(), kOwnerChunk) + chunks_of(b.size(), kOwnerChunk) +
                chunks_of(own->size(), kOwnerChunk)
          : chunks_of(all.size(), kOwnerChunk) + chunks_of(own->size(), kOwnerChunk);
  EXPECT_GE(owner_made, owner_least);
  std::printf("registrations: owner %llu, fetcher %llu\n",
              static_cast<unsigned long long>(owner_made),
              static_cast<unsigned long long>(rdma::registration_counters(client)->registrations -
                                              fetcher_before));
}

INSTANTIATE_TEST_SUITE_P(Grants, RdmaChunks,
                         ::testing::Values(RdmaGrants::registrations, RdmaGrants::regions,
                                           RdmaGrants::windows),
                         [](const auto& info) { return rdma::rdma_grants_name(info.param); });

// Soft-RoCE on Linux 6.12 refuses a single registration over 1 GiB: an object of 1 GiB and
// 1 MiB (model weights are often larger), fetched with every option at its default into ferry's
// memory, arrives whole, both sides having registered it in chunks of the device's largest
// registration. Before that, the fetch failed with device_error.
TEST_F(Rdma, AnObjectOverOneGiBArrivesWhole) {
  // Default peer timeouts on both sides: registering 1 GiB (each side) takes longer than that in
  // the emulated guest beside a busy host, and runs off the io threads, which keep talking.
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern((1u << 30) + (1u << 20), 63);
  const ObjectRef ref = server.put(bytes);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = peer.fetch(ref, {}, {.timeout = scaled(540s)});
  ASSERT_FALSE(r.wait(scaled(600s))) << r.wait(0s).message();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.result().transport, "RDMA");
  EXPECT_TRUE(same_bytes(r.result().tensors[0], *bytes));
  const auto owner_reg = rdma::registration_counters(server.ctx);
  const auto fetcher_reg = rdma::registration_counters(client);
  std::printf(
      "1025 MiB in %.1f s (%.0f MB/s); registering took the owner %.1f s, the fetcher %.1f s\n",
      took, bytes->size() / took / 1e6, owner_reg ? owner_reg->registration_ns / 1e9 : 0.0,
      fetcher_reg ? fetcher_reg->registration_ns / 1e9 : 0.0);
  // The owner lets the object go: its registrations go with it (or went at its lease's end, with
  // per-grant registrations), each deregistration timed.
  EXPECT_TRUE(server.ctx.release(ref));
  EXPECT_TRUE(eventually([&] {
    return rdma::registration_counters(server.ctx)->deregistrations >= owner_reg->registrations;
  }));
  std::printf("deregistering took the owner %.2f s\n",
              rdma::registration_counters(server.ctx)->deregistration_ns / 1e9);
}

// ---------------------------------------------------------------- access control

// An owner with three 64 KiB objects. `shared_region`: views of one 1 MiB allocation, put with
// it as their region (one registration covers all); otherwise separate allocations, each
// registered on its own.
struct GrantFixture {
  explicit GrantFixture(RdmaGrants grants, bool shared_region = false)
      : server(owner_options(grants)) {
    for (size_t i = 0; i < 3; ++i) {
      auto bytes = shared_region ? memory : make_pattern(kObject, 50 + i);
      auto view = shared_region ? object(i) : std::span<const std::byte>(*bytes);
      if (!shared_region) objects.push_back(bytes);
      PutOptions o;
      if (shared_region) o.region = *memory;
      auto ref = server.ctx.put({Tensor::bytes(view)}, bytes, o);
      EXPECT_TRUE(ref.ok());
      refs.push_back(*ref);
    }
  }
  std::span<const std::byte> object(size_t i) const {
    if (!objects.empty()) return *objects[i];
    return std::span<const std::byte>(*memory).subspan(i * kObject, kObject);
  }
  static constexpr size_t kObject = 64u << 10;
  std::shared_ptr<std::vector<std::byte>> memory = make_pattern(1u << 20, 41);
  std::vector<std::shared_ptr<std::vector<std::byte>>> objects;
  Server server;
  std::vector<ObjectRef> refs;
};

// Every lease of the fixture's owner ended: no window stays bound, no grant registration stays,
// nothing stays pinned (the release that ends a lease is one-way: waited for).
void expect_no_grant_left(GrantFixture& f) {
  // Only grant registrations come and go with leases; other registrations live with the objects.
  const bool per_grant = f.server.ctx.options()
                             .transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName)
                             .grants == RdmaGrants::registrations;
  struct Left {
    uint64_t windows = 0, registrations = 0, pins = 0;
  } left;
  eventually([&] {
    const auto c = rdma::registration_counters(f.server.ctx);
    left = {c->windows, per_grant ? c->live : 0, 0};
    for (const auto& ref : f.refs) left.pins += f.server.ctx.store().counts(ref.object_id)->pins;
    return left.windows + left.registrations + left.pins == 0;
  });
  EXPECT_EQ(left.windows, 0u);
  EXPECT_EQ(left.registrations, 0u);
  EXPECT_EQ(left.pins, 0u);
}

// The fetcher's READ came back with IBV_WC_REM_ACCESS_ERR (10): the owner's device refused it.
bool is_remote_access_error(std::error_code ec) {
  constexpr int kRemAccessErr = 10;  // IBV_WC_REM_ACCESS_ERR, without the verbs header here
  return ec.category().name() == std::string("ibv_wc") && ec.value() == kRemAccessErr;
}

// Fetches of an honest peer, running until stopped; counts successes and failures.
struct HonestPeer {
  HonestPeer(const std::string& address, const ObjectRef& ref, std::span<const std::byte> expect)
      : ctx(client_options("honest")) {
    peer = connect_or_fail(ctx, address);
    worker = std::thread([this, ref, expect] {
      while (!stop) {
        auto r = peer.fetch(ref);
        auto ec = r.wait(scaled(60s));
        if (!ec && same_bytes(r.result().tensors[0], expect)) {
          ++ok;
        } else {
          ++bad;
          std::printf("honest peer: %s\n", ec ? ec.message().c_str() : "wrong bytes");
        }
      }
    });
  }
  ~HonestPeer() { finish(); }
  void finish() {
    stop = true;
    if (worker.joinable()) worker.join();
  }
  Context ctx;
  Peer peer;
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::thread worker;
};

// A peer READs the 64 KiB after the object it was granted (and reconnects, and reads again),
// while an honest peer fetches throughout.
void read_past_the_grant(GrantFixture& f) {
  HonestPeer honest(f.server.address(), f.refs[2], f.object(2));
  Context attacker(client_options("attacker"));
  auto peer = connect_or_fail(attacker, f.server.address());
  rdma::set_grant_tamper(attacker, [](uint64_t& addr, uint32_t&, uint64_t length) {
    addr += length;
    return true;
  });
  for (int round = 0; round < 3; ++round) {
    auto r = peer.fetch(f.refs[0]);
    auto ec = r.wait(scaled(60s));
    ASSERT_TRUE(ec) << "a READ past the granted range succeeded";
    EXPECT_TRUE(is_remote_access_error(ec)) << ec.category().name() << ": " << ec.message();
    EXPECT_EQ(scope_of(ec), Scope::peer);
  }
  // The same peer, honest again, gets a new queue pair and its data.
  rdma::set_grant_tamper(attacker, {});
  auto r = peer.fetch(f.refs[0]);
  ASSERT_FALSE(r.wait(scaled(60s)));
  EXPECT_TRUE(same_bytes(r.result().tensors[0], f.object(0)));
  honest.finish();
  std::printf("honest peer meanwhile: %d fetches, %d failed\n", honest.ok.load(),
              honest.bad.load());
  EXPECT_GT(honest.ok.load(), 0);
  EXPECT_EQ(honest.bad.load(), 0) << "the attacker disturbed another peer";
  expect_no_grant_left(f);
}

TEST_F(Rdma, AReadPastTheGrantIsARemoteAccessErrorAndOtherPeersCarryOn) {
  GrantFixture f(RdmaGrants::windows);
  read_past_the_grant(f);
}

TEST_F(Rdma, AReadPastAGrantRegistrationIsARemoteAccessErrorAndOtherPeersCarryOn) {
  GrantFixture f(RdmaGrants::registrations);
  read_past_the_grant(f);
}

// Views of one registered allocation: the bytes after the granted view are registered too, so
// only the window's own bounds refuse the READ. rxe (Linux 6.1's rxe_resp.c) checks a window
// access against the registration's range, not the window's: there the READ would succeed.
TEST_F(Rdma, AReadOfTheNeighbouringViewThroughAWindowIsARemoteAccessError) {
  if (std::filesystem::exists("/sys/class/infiniband/rxe0")) {
    GTEST_SKIP() << "SKIPPED: rxe does not enforce memory-window bounds (it checks the "
                    "underlying registration's range); needs an RDMA NIC (the same attack on "
                    "grant registrations runs here)";
  }
  GrantFixture f(RdmaGrants::windows, /*shared_region=*/true);
  read_past_the_grant(f);
}

// The same on per-grant registrations (rxe's default): each grant registers exactly its view.
TEST_F(Rdma, AReadOfTheNeighbouringViewOfAGrantRegistrationIsARemoteAccessError) {
  GrantFixture f(RdmaGrants::registrations, /*shared_region=*/true);
  read_past_the_grant(f);
}

// A GrantTamper that stores each grant's address and rkey in `addr` and `rkey` (plain or atomic,
// outliving the tamper) and lets the fetch read (`read`) or holds it.
template <typename Addr, typename Rkey>
rdma::GrantTamper recording_tamper(Addr& addr, Rkey& rkey, bool read) {
  return [&addr, &rkey, read](uint64_t& granted_addr, uint32_t& granted_rkey, uint64_t) {
    addr = granted_addr;
    rkey = granted_rkey;
    return read;
  };
}

// A GrantTamper that replaces each grant's address and rkey by what `addr` and `rkey` hold when
// the grant comes (another grant's, recorded by recording_tamper), and lets the fetch read.
template <typename Addr, typename Rkey>
rdma::GrantTamper replaying_tamper(const Addr& addr, const Rkey& rkey) {
  return [&addr, &rkey](uint64_t& granted_addr, uint32_t& granted_rkey, uint64_t) {
    granted_addr = addr;
    granted_rkey = rkey;
    return true;
  };
}

void expired_grant_reads_nothing(RdmaGrants grants) {
  GrantFixture f(grants);
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, f.server.address());
  uint64_t old_addr = 0;
  uint32_t old_rkey = 0;
  rdma::set_grant_tamper(client, recording_tamper(old_addr, old_rkey, /*read=*/true));
  auto first = peer.fetch(f.refs[0]);
  ASSERT_FALSE(first.wait(scaled(60s)));
  ASSERT_NE(old_rkey, 0u);
  // The lease ended with the first fetch; its rkey, replayed on a new grant, must not work.
  rdma::set_grant_tamper(client, replaying_tamper(old_addr, old_rkey));
  auto replay = peer.fetch(f.refs[1]);
  auto ec = replay.wait(scaled(60s));
  ASSERT_TRUE(ec) << "an expired rkey still reads the owner's memory";
  EXPECT_TRUE(is_remote_access_error(ec)) << ec.message();
  // A forged rkey: the grant's, off by one.
  rdma::set_grant_tamper(client, [](uint64_t&, uint32_t& rkey, uint64_t) {
    rkey ^= 1;
    return true;
  });
  auto forged = peer.fetch(f.refs[1]);
  ec = forged.wait(scaled(60s));
  ASSERT_TRUE(ec) << "a forged rkey read the owner's memory";
  EXPECT_TRUE(is_remote_access_error(ec)) << ec.message();
  expect_no_grant_left(f);
}

TEST_F(Rdma, AnExpiredWindowGrantReadsNothing) { expired_grant_reads_nothing(RdmaGrants::windows); }

TEST_F(Rdma, AnExpiredGrantRegistrationReadsNothing) {
  expired_grant_reads_nothing(RdmaGrants::registrations);
}

// Peer A holds a live grant (and never reads it); peer B replays A's address and rkey. The
// result of B's fetch: its error, or none when the READ went through.
std::error_code read_with_another_peers_grant(RdmaGrants grants) {
  GrantFixture f(grants);
  Context a(client_options("a")), b(client_options("b"));
  auto pa = connect_or_fail(a, f.server.address());
  auto pb = connect_or_fail(b, f.server.address());
  std::atomic<uint64_t> a_addr{0};
  std::atomic<uint32_t> a_rkey{0};
  // Held: A's lease stays live, its window bound.
  rdma::set_grant_tamper(a, recording_tamper(a_addr, a_rkey, /*read=*/false));
  auto held = pa.fetch(f.refs[0], {}, {.timeout = 20s});
  for (int i = 0; i < 2000 && !a_rkey; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_NE(a_rkey.load(), 0u) << "A got no grant";
  rdma::set_grant_tamper(b, replaying_tamper(a_addr, a_rkey));
  auto stolen = pb.fetch(f.refs[1]);
  auto ec = stolen.wait(scaled(60s));
  if (!ec) {
    EXPECT_TRUE(same_bytes(stolen.result().tensors[0], f.object(0)));
  }
  EXPECT_FALSE(held.done()) << "A's lease ended early: the test proves nothing";
  held.abort();
  EXPECT_NE(held.wait(scaled(60s)), errc::timed_out);
  expect_no_grant_left(f);
  return ec;
}

TEST_F(Rdma, AnotherPeersLiveWindowGrantReadsNothing) {
  auto ec = read_with_another_peers_grant(RdmaGrants::windows);
  ASSERT_TRUE(ec) << "peer B read memory granted to peer A";
  EXPECT_TRUE(is_remote_access_error(ec)) << ec.message();
}

TEST_F(Rdma, AnotherPeersLiveGrantRegistrationReadsNothing) {
  auto ec = read_with_another_peers_grant(RdmaGrants::registrations);
  ASSERT_TRUE(ec) << "peer B read memory granted to peer A";
  EXPECT_TRUE(is_remote_access_error(ec)) << ec.message();
}

// What per-peer grants buy: with region rkeys (RdmaGrants::regions) the same replay reads A's
// object. The tests above are not vacuous.
TEST_F(Rdma, WithRegionGrantsAnotherPeersGrantIsReadable) {
  EXPECT_FALSE(read_with_another_peers_grant(RdmaGrants::regions));
}

// Per-grant registrations (the default on rxe) are made per fetch and gone with its lease.
TEST_F(Rdma, GrantRegistrationsLastExactlyAsLongAsTheirLease) {
  Server server(owner_options(RdmaGrants::registrations));
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(3u << 20, 5);
  auto ref = server.put(bytes);
  const auto before = *rdma::registration_counters(server.ctx);
  EXPECT_EQ(before.registrations, 0u) << "a put registered owner memory";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fetch_completes(peer, ref, *bytes, 60s));
  }
  // The release that ends each lease is one-way: wait for the last to arrive.
  eventually([&] { return rdma::registration_counters(server.ctx)->live == 0; });
  const auto after = *rdma::registration_counters(server.ctx);
  EXPECT_EQ(after.registrations, 3u) << "one registration per grant";
  EXPECT_EQ(after.deregistrations, 3u);
  EXPECT_EQ(after.live, 0u) << "a lease ended and its registration stayed";
  EXPECT_EQ(after.windows, 0u);
}

}  // namespace
}  // namespace ferry::test
