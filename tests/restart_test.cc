// The core's restart of a fetch whose data channel broke (PeerLink::restart_fetch), as logic: a
// fake one-sided transport whose two ends live in this process (the owner's "grant" copies the
// pinned bytes straight into the fetcher's targets) and whose channel breaks on demand. Real
// sessions over loopback TCP carry everything else. The real transport's restarts (a queue pair
// broken under READs) are tested in the guest (rdma_test.cc, collective_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstring>
#include <map>
#include <mutex>

#include "tests/test_util.h"

namespace ferry::test {
namespace {
using namespace std::chrono_literals;

constexpr const char* kFlaky = "FLAKY";

// What the test sets and sees, shared by the fetcher's and the owner's transport instance.
struct Board {
  std::mutex mu;
  int breaks = 0;     // fetches whose channel breaks under them (fetcher side)
  bool hold = false;  // fetches that get past the breaks never complete
  std::chrono::milliseconds reopen_delay{0};  // before a channel after the first one is ready
  int opens = 0;
  std::vector<uint64_t> request_ids;  // of every fetch handed to the transport
  std::vector<uint64_t> resume_ats;   // FetchOp::resume_at of each
  // With `source` (the object's bytes, one tensor): each break first lands `step` more bytes of
  // it into the target and reports them landed, as a queue pair that completed some READs.
  std::shared_ptr<std::vector<std::byte>> source;
  uint64_t step = 0;
  struct Waiting {
    std::shared_ptr<PeerLink> link;
    std::vector<MutableBuffer> targets;
    uint64_t resume_at = 0;
  };
  std::map<uint64_t, Waiting> waiting;  // fetches the owner's grant completes
};

// One peer's end: the fetcher's records its fetches on the board (and breaks under them while
// the board says so); the owner's "grant" copies the pinned bytes into the fetcher's targets.
class FlakyChannel final : public TransportChannel {
 public:
  FlakyChannel(std::shared_ptr<Board> board, std::shared_ptr<PeerLink> link)
      : board_(std::move(board)), link_(std::move(link)) {}

  Result<FetchRequest> fetch_multiple(const FetchOp& op) override {
    auto link = link_.lock();
    if (!link) return make_error_code(errc::peer_closed);
    std::lock_guard lock(board_->mu);
    board_->request_ids.push_back(op.request_id);
    board_->resume_ats.push_back(op.resume_at);
    if (board_->breaks > 0) {
      --board_->breaks;
      uint64_t landed = 0;
      if (board_->source) {
        landed = std::min<uint64_t>(op.resume_at + board_->step, board_->source->size());
        std::memcpy(op.targets[0].data() + op.resume_at, board_->source->data() + op.resume_at,
                    landed - op.resume_at);
      }
      // As RdmaChannel::fail does: restart, then drop the channel.
      boost::asio::post(link->strand(), [l = link, id = op.request_id, landed] {
        l->restart_fetch(id, make_error_code(errc::peer_unresponsive), landed);
        l->drop_channel(kFlaky, make_error_code(errc::peer_unresponsive));
      });
    } else if (!board_->hold) {
      board_->waiting[op.request_id] = {link, op.targets, op.resume_at};
    }
    return op.request;
  }
  // Owner side: copies the object into the fetcher's targets (past the bytes an earlier attempt
  // left there, counted over the tensors in order) and completes its fetch there.
  void send_multiple(uint64_t request_id, ObjectStore::Pin pin, SendDone done) override {
    Board::Waiting w;
    {
      std::lock_guard lock(board_->mu);
      auto it = board_->waiting.find(request_id);
      if (it == board_->waiting.end()) return done(make_error_code(errc::aborted));
      w = std::move(it->second);
      board_->waiting.erase(it);
    }
    const auto& tensors = pin.object().tensors;
    uint64_t skip = w.resume_at;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const uint64_t from = std::min<uint64_t>(skip, tensors[i].data.size());
      skip -= from;
      std::memcpy(w.targets[i].data() + from, tensors[i].data.data() + from,
                  tensors[i].data.size() - from);
    }
    boost::asio::post(w.link->strand(),
                      [l = w.link, request_id] { l->complete_fetch(request_id, {}); });
    done({});
  }
  bool abort(uint64_t request_id) override {
    std::lock_guard lock(board_->mu);
    board_->waiting.erase(request_id);
    return true;
  }
  void close(std::error_code) override {}

 private:
  std::shared_ptr<Board> board_;
  std::weak_ptr<PeerLink> link_;
};

class FlakyTransport final : public TransportManager {
 public:
  explicit FlakyTransport(std::shared_ptr<Board> board) : board_(std::move(board)) {}
  std::string name() const override { return kFlaky; }
  bool is_one_sided() const override { return true; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override { return {kFlaky, {"cpu"}, "", 1}; }

  // The owner installs its half when the "open" message arrives (before any Fetch that follows
  // it on the metadata channel), replacing a stale one as the RDMA transport does.
  void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) override {
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard lock(board_->mu);
      if (board_->opens++ > 0) delay = board_->reopen_delay;
    }
    link->send_transport_message(kFlaky, 0, "open");
    auto timer = std::make_shared<boost::asio::steady_timer>(link->strand(), delay);
    timer->async_wait(
        [timer, board = board_, link, done = std::move(done)](boost::system::error_code) {
          done({}, std::make_shared<FlakyChannel>(board, link));
        });
  }
  void on_transport_message(PeerLink& link, uint64_t, std::string_view) override {
    if (link.channel(kFlaky)) link.drop_channel(kFlaky, make_error_code(errc::peer_closed));
    link.install_channel(kFlaky, std::make_shared<FlakyChannel>(board_, link.shared_link()));
  }
  void garbage_collect(const StoredObject&) override {}

 private:
  std::shared_ptr<Board> board_;
};

// Registers FLAKY for the test's lifetime; the contexts are made after it.
struct Fixture {
  Fixture() {
    EXPECT_FALSE(register_transport(kFlaky, {"cpu"}, [b = board](const TransportEnv&) {
      return Result<std::shared_ptr<TransportManager>>(
          std::shared_ptr<TransportManager>(std::make_shared<FlakyTransport>(b)));
    }));
    server = std::make_unique<Server>();
    client = std::make_unique<Context>(client_options("client"));
    peer = connect_or_fail(*client, server->address());
    options.transport = kFlaky;
  }
  ~Fixture() {
    peer.close();
    client.reset();
    server.reset();
    EXPECT_FALSE(unregister_transport(kFlaky));
  }
  template <typename F>
  auto on_board(F f) {
    std::lock_guard lock(board->mu);
    return f(*board);
  }
  std::shared_ptr<Board> board = std::make_shared<Board>();
  std::unique_ptr<Server> server;
  std::unique_ptr<Context> client;
  Peer peer;
  FetchOptions options;
};

TEST(FetchRestarts, AFetchWhoseChannelBrokeStartsAgainOverANewOne) {
  Fixture f;
  auto data = make_pattern(100'000, 7);
  auto ref = f.server->put(data);
  f.on_board([](Board& b) { b.breaks = 2; });
  auto req = f.peer.fetch(ref, {}, f.options);
  ASSERT_FALSE(req.wait(scaled(10s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *data));
  EXPECT_EQ(req.result().restarts, 2u);
  EXPECT_EQ(req.result().transport, kFlaky);
  const auto ids = f.on_board([](Board& b) { return b.request_ids; });
  ASSERT_EQ(ids.size(), 3u) << "one request per start";
  EXPECT_EQ(ids[0], req.id()) << "the caller's id is the first request's";
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[1]);
  EXPECT_EQ(f.on_board([](Board& b) { return b.opens; }), 3) << "a new channel per start";
  // The session is unharmed: a plain fetch goes through at once.
  auto again = f.peer.fetch(ref, {}, f.options);
  ASSERT_FALSE(again.wait(scaled(10s)));
  EXPECT_EQ(again.result().restarts, 0u);
}

TEST(FetchRestarts, GivesUpWithTheChannelsErrorAfterThreeRestarts) {
  Fixture f;
  auto ref = f.server->put(make_pattern(1000, 8));
  f.on_board([](Board& b) { b.breaks = 100; });
  auto req = f.peer.fetch(ref, {}, f.options);
  EXPECT_EQ(req.wait(scaled(10s)), errc::peer_unresponsive);
  EXPECT_EQ(f.on_board([](Board& b) { return b.request_ids.size(); }), 1u + kMaxFetchRestarts);
}

// Each attempt lands a tenth of the object before its channel breaks: every restart resumes
// after the bytes the attempts before it left (the owner's last "grant" copies only the rest),
// and, each having made progress, the fetch goes on past kMaxFetchRestarts restarts.
TEST(FetchRestarts, AnAttemptThatLandedBytesIsResumedAfterThemAndNotCountedAgainstTheLimit) {
  Fixture f;
  auto data = make_pattern(100'000, 12);
  auto ref = f.server->put(data);
  constexpr int kBreaks = 2 * kMaxFetchRestarts;
  f.on_board([&](Board& b) {
    b.breaks = kBreaks;
    b.source = data;
    b.step = 10'000;
  });
  std::vector<std::byte> target(data->size(), std::byte{0});
  auto req = f.peer.fetch(ref, {target}, f.options);
  ASSERT_FALSE(req.wait(scaled(10s))) << req.wait(0s).message();
  EXPECT_EQ(req.result().restarts, static_cast<uint32_t>(kBreaks));
  EXPECT_TRUE(same_bytes(target, *data));
  EXPECT_EQ(req.bytes_landed(), data->size());
  const auto resumed = f.on_board([](Board& b) { return b.resume_ats; });
  ASSERT_EQ(resumed.size(), kBreaks + 1u);
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i], i * 10'000) << "attempt " << i << " resumed elsewhere";
  }
}

// Without progress the count runs on from an attempt that made some: the fetch fails after
// kMaxFetchRestarts fruitless restarts in a row.
TEST(FetchRestarts, FruitlessRestartsAfterProgressAreStillBounded) {
  Fixture f;
  auto data = make_pattern(100'000, 13);
  auto ref = f.server->put(data);
  f.on_board([&](Board& b) {
    b.breaks = 100;
    b.source = data;
    b.step = 60'000;  // the first attempt lands 60 %, the second the rest, then nothing more
  });
  std::vector<std::byte> target(data->size());
  auto req = f.peer.fetch(ref, {target}, f.options);
  EXPECT_EQ(req.wait(scaled(10s)), errc::peer_unresponsive);
  // Two attempts with progress, then 1 + kMaxFetchRestarts that land nothing new.
  EXPECT_EQ(f.on_board([](Board& b) { return b.request_ids.size(); }), 3u + kMaxFetchRestarts);
}

// A ref by name may stand for another object by the next attempt: it is read whole again.
TEST(FetchRestarts, AFetchByNameStartsAgainFromItsFirstByte) {
  Fixture f;
  auto data = make_pattern(50'000, 14);
  PutOptions o;
  o.name = "restart/by-name";
  ASSERT_TRUE(f.server->ctx.put({Tensor::bytes(*data)}, data, o).ok());
  f.on_board([&](Board& b) {
    b.breaks = 2;
    b.source = data;
    b.step = 10'000;
  });
  std::vector<std::byte> target(data->size());
  auto ref =
      ObjectRef::named(f.server->address(), "restart/by-name", {TensorMeta::bytes(data->size())});
  auto req = f.peer.fetch(ref, {target}, f.options);
  ASSERT_FALSE(req.wait(scaled(10s))) << req.wait(0s).message();
  EXPECT_TRUE(same_bytes(target, *data));
  EXPECT_EQ(f.on_board([](Board& b) { return b.resume_ats; }), (std::vector<uint64_t>{0, 0, 0}));
}

// The bytes land in ferry's slots and are combined once, on success: a restart combines nothing
// twice (the combine here is XOR, which a second application would undo).
TEST(FetchRestarts, ACombiningFetchCombinesOnceAcrossRestarts) {
  Fixture f;
  auto data = make_pattern(4096, 9);
  auto ref = f.server->put(data);
  f.on_board([](Board& b) { b.breaks = 1; });
  std::vector<std::byte> target(data->size(), std::byte{0x5a});
  auto options = f.options;
  options.combine = [](std::span<std::byte> into, std::span<const std::byte> arrived) {
    for (size_t i = 0; i < into.size(); ++i) into[i] ^= arrived[i];
  };
  auto req = f.peer.fetch(ref, {target}, options);
  ASSERT_FALSE(req.wait(scaled(10s)));
  EXPECT_EQ(req.result().restarts, 1u);
  std::vector<std::byte> expected(*data);
  for (auto& b : expected) b ^= std::byte{0x5a};
  EXPECT_TRUE(same_bytes(target, expected));
}

// Aborted while it waits for its new channel: it completes once, at once, with the abort, and
// is not started again when the channel comes.
TEST(FetchRestarts, AnAbortWhileWaitingForTheNewChannelEndsIt) {
  Fixture f;
  auto ref = f.server->put(make_pattern(1000, 10));
  f.on_board([](Board& b) {
    b.breaks = 1;
    b.reopen_delay = 600ms;
  });
  auto req = f.peer.fetch(ref, {}, f.options);
  ASSERT_TRUE(eventually([&] { return f.on_board([](Board& b) { return b.opens; }) == 2; }));
  const auto t0 = std::chrono::steady_clock::now();
  req.abort();
  EXPECT_EQ(req.wait(scaled(5s)), errc::aborted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(400ms))
      << "the abort waited for the channel";
  std::this_thread::sleep_for(800ms);  // the channel is ready by now
  EXPECT_EQ(f.on_board([](Board& b) { return b.request_ids.size(); }), 1u)
      << "an aborted fetch was started again";
  f.on_board([](Board& b) { b.reopen_delay = 0ms; });
  EXPECT_FALSE(f.peer.fetch(ref, {}, f.options).wait(scaled(10s)));
}

// A restart keeps the fetch's deadline: one that never completes after it still times out then.
TEST(FetchRestarts, TheDeadlineHoldsAcrossARestart) {
  Fixture f;
  auto ref = f.server->put(make_pattern(1000, 11));
  f.on_board([](Board& b) {
    b.breaks = 1;
    b.hold = true;
  });
  auto options = f.options;
  options.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto req = f.peer.fetch(ref, {}, options);
  EXPECT_EQ(req.wait(scaled(5s)), errc::timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(1500ms));
  EXPECT_EQ(f.on_board([](Board& b) { return b.request_ids.size(); }), 2u);
}

}  // namespace
}  // namespace ferry::test
