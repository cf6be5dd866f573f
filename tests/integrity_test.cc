// What a fetcher accepts from an owner: a fetch succeeds only when every byte of every target was
// written exactly once (and, for a ref with checksums, when the bytes match them), and a ref that
// announces more memory than the machine has fails with resource_exhausted, promptly, with or
// without a deadline. The owner here is a scripted one that speaks the wire protocol
// (net/proto/ferry.proto, ferry/tcp/data_frame.h) over real sockets, and sends exactly the chunks a
// test gives it.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <optional>
#include <thread>

#include "ferry/net/coverage.h"
#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/system/system_memory.h"
#include "ferry/store/checksum.h"
#include "ferry/tcp/data_frame.h"
#include "tests/raw_frames.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using testing_frames::read_frame;
using testing_frames::write_frame;

struct Chunk {
  uint32_t tensor = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool last = false;
  bool corrupt = false;  // its first byte is sent with one bit flipped
};

// An owner that accepts one peer, answers its handshake (TCP chosen), takes its data channel,
// and answers its first Fetch with `chunks` of a byte pattern. Blocking sockets on its own
// thread; every accept and read ends with the peer's close or the listener's shutdown.
class ScriptedOwner {
 public:
  // `ping_with_answer`: a Ping follows the answer at once, as from an acceptor whose session (and
  // heartbeat) is open while the initiator still attaches its data channel.
  explicit ScriptedOwner(std::vector<Chunk> chunks, bool ping_with_answer = false)
      : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)),
        chunks_(std::move(chunks)),
        ping_with_answer_(ping_with_answer) {
    thread_ = std::thread([this] { run(); });
  }
  // The fetcher's Context goes first, closing its connections, which ends the thread's reads; a
  // shutdown of the listener ends an accept still waiting (Linux: EINVAL). The sockets close
  // after the thread has ended: closing one under a thread blocked in it would be a race.
  ~ScriptedOwner() {
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    thread_.join();
  }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  // The byte the owner sends at `offset` of any tensor.
  static std::byte pattern(uint64_t offset) { return static_cast<std::byte>(offset * 7 + 1); }

 private:
  void run() {
    boost::system::error_code ec;
    acceptor_.accept(meta_, ec);
    if (ec) return;
    auto hello = read_frame(meta_);
    if (!hello || !hello->has_hello()) return;
    wire::Envelope answer;
    auto* a = answer.mutable_hello_answer();
    a->set_protocol_version(kProtocolVersion);
    a->set_name("scripted");
    a->set_chosen_transport("TCP");
    a->set_session_id(1);
    a->set_session_token("token");
    auto* t = a->add_transports();
    t->set_name("TCP");
    t->add_devices("cpu");
    t->set_priority(10);
    if (ping_with_answer_) {
      wire::Envelope ping;
      ping.mutable_ping()->set_nonce(5);
      boost::system::error_code ignored;
      const auto both = encode_frame(answer) + encode_frame(ping);  // in one read at the peer
      asio::write(meta_, asio::buffer(both), ignored);
    } else {
      write_frame(meta_, answer);
    }
    acceptor_.accept(data_, ec);
    if (ec) return;
    auto attach = read_frame(data_);
    if (!attach || !attach->has_attach_channel()) return;
    wire::Envelope ack;
    ack.mutable_ack();
    write_frame(data_, ack);
    for (;;) {  // heartbeats until the fetch
      auto env = read_frame(meta_);
      if (!env) return;
      if (env->has_fetch()) {
        send_chunks(env->request_id());
        break;
      }
    }
    while (read_frame(meta_)) {  // until the peer goes
    }
  }
  void send_chunks(uint64_t request_id) {
    for (const auto& c : chunks_) {
      ferry::tcp::DataHeader h;
      h.request_id = request_id;
      h.tensor = c.tensor;
      h.offset = c.offset;
      h.length = c.length;
      h.flags = c.last ? ferry::tcp::kFlagEnd : 0;
      std::vector<std::byte> payload(c.length);
      for (uint64_t i = 0; i < c.length; ++i) payload[i] = pattern(c.offset + i);
      if (c.corrupt && c.length > 0) payload[0] ^= std::byte{0x10};
      boost::system::error_code ignored;
      asio::write(data_, std::array{asio::buffer(&h, sizeof h), asio::buffer(payload)}, ignored);
    }
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  tcp::socket meta_{io_};
  tcp::socket data_{io_};
  std::vector<Chunk> chunks_;
  bool ping_with_answer_ = false;
  std::thread thread_;
};

// Fetches one tensor of `size` bytes from a scripted owner sending `chunks` into a buffer filled
// with 0xEE, with a ref carrying the CRC-32C of the honest pattern when `checksummed`; returns
// the fetch's outcome and the buffer.
std::pair<std::error_code, std::vector<std::byte>> fetch_from_script(uint64_t size,
                                                                     std::vector<Chunk> chunks,
                                                                     bool ping_with_answer = false,
                                                                     bool checksummed = false) {
  ScriptedOwner owner(std::move(chunks), ping_with_answer);
  ContextOptions o;
  o.name = "fetcher";
  o.transport = "TCP";
  Context ctx(o);
  auto peer = ctx.connect(owner.address());
  EXPECT_TRUE(peer.ok()) << peer.error().message();
  if (!peer.ok()) return {peer.error(), {}};
  ObjectRef ref;
  ref.owner = owner.address();
  ref.object_id = 1;
  ref.metadata.tensors = {TensorMeta::bytes(size)};
  if (checksummed) {
    std::vector<std::byte> honest(size);
    for (uint64_t i = 0; i < size; ++i) honest[i] = ScriptedOwner::pattern(i);
    ref.metadata.tensors[0].checksum = crc32c(honest);
  }
  std::vector<std::byte> into(size, std::byte{0xEE});
  auto ec = peer->fetch(ref, {into}).wait(scaled(10s));
  return {ec, std::move(into)};
}

TEST(Integrity, TheScriptedOwnerDeliversAnHonestFetch) {
  // The control: the same owner, sending each half once, is a success with every byte right.
  auto [ec, got] = fetch_from_script(1000, {{0, 0, 500, false}, {0, 500, 500, true}});
  ASSERT_FALSE(ec) << ec.message();
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ScriptedOwner::pattern(i)) << i;
}

// The acceptor's session is open before its answer leaves: a Ping that reaches the initiator
// while it still attaches its data channel is answered, not taken for a broken handshake.
TEST(Integrity, APingWhileTheDataChannelIsAttachedIsNoProtocolError) {
  auto [ec, got] = fetch_from_script(1000, {{0, 0, 1000, true}}, true);
  ASSERT_FALSE(ec) << ec.message();
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ScriptedOwner::pattern(i)) << i;
}

TEST(Integrity, ChunksThatOverlapFailTheFetch) {
  // The first half twice: as many bytes as the target, but the second half never written.
  auto [ec, got] = fetch_from_script(1000, {{0, 0, 500, false}, {0, 0, 500, true}});
  EXPECT_EQ(ec, errc::protocol_error) << ec.message();
  // Partly overlapping, in the other order.
  std::tie(ec, got) = fetch_from_script(1000, {{0, 400, 600, false}, {0, 0, 500, true}});
  EXPECT_EQ(ec, errc::protocol_error) << ec.message();
}

TEST(Integrity, AGapFailsTheFetch) {
  auto [ec, got] = fetch_from_script(1000, {{0, 0, 400, false}, {0, 600, 400, true}});
  EXPECT_EQ(ec, errc::protocol_error) << ec.message();
}

TEST(Integrity, ChunksOutOfOrderThatCoverEveryByteOnceSucceed) {
  auto [ec, got] =
      fetch_from_script(1000, {{0, 600, 400, false}, {0, 0, 300, false}, {0, 300, 300, true}});
  ASSERT_FALSE(ec) << ec.message();
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ScriptedOwner::pattern(i)) << i;
}

// A ref with checksums: bytes that cover the target once in any order pass; one bit flipped on
// the wire fails the fetch with data_corrupted, and the target holds the bytes as they landed.
TEST(Integrity, AFlippedBitFailsAFetchWhoseRefCarriesChecksums) {
  auto [ec, got] =
      fetch_from_script(100000, {{0, 60000, 40000, false}, {0, 0, 60000, true}}, false, true);
  ASSERT_FALSE(ec) << ec.message();
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ScriptedOwner::pattern(i)) << i;

  std::tie(ec, got) =
      fetch_from_script(100000, {{0, 0, 60000, false}, {0, 60000, 40000, true, true}}, false, true);
  EXPECT_EQ(ec, errc::data_corrupted) << ec.message();
  EXPECT_EQ(scope_of(ec), Scope::operation);
  EXPECT_EQ(got[60000], ScriptedOwner::pattern(60000) ^ std::byte{0x10});
  EXPECT_EQ(got[59999], ScriptedOwner::pattern(59999));

  // The same flipped bit under a ref without checksums is not seen: what the check adds.
  std::tie(ec, got) =
      fetch_from_script(100000, {{0, 0, 60000, false}, {0, 60000, 40000, true, true}});
  EXPECT_FALSE(ec) << ec.message();
}

TEST(Coverage, RefusesOverlapsAndRangesOutsideAndCountsEveryByteOnce) {
  Coverage c(100);
  EXPECT_TRUE(c.add(10, 10));
  EXPECT_FALSE(c.add(15, 10));  // overlaps [10, 20)
  EXPECT_FALSE(c.add(0, 11));   // overlaps its first byte
  EXPECT_FALSE(c.add(95, 6));   // leaves the target
  EXPECT_FALSE(c.add(101, 0));  // starts past it
  EXPECT_TRUE(c.add(100, 0));   // an empty range at the end
  EXPECT_TRUE(c.add(0, 10));    // joins [10, 20) from below
  EXPECT_TRUE(c.add(30, 70));
  EXPECT_FALSE(c.complete());
  EXPECT_EQ(c.written(), 90u);
  EXPECT_TRUE(c.add(20, 10));  // closes the gap between the two
  EXPECT_TRUE(c.complete());
  EXPECT_FALSE(c.add(50, 1));
}

TEST(Coverage, AScatteringPeerIsRefusedPastTheRangeLimit) {
  Coverage c(1u << 20);
  size_t accepted = 0;
  for (uint64_t off = 0; off < (1u << 20); off += 2) {
    if (!c.add(off, 1)) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, Coverage::kMaxRanges);
}

// A ref can announce any size up to 2^48 bytes a tensor: one that asks for more memory than the
// machine has fails the fetch with resource_exhausted at once, with or without a deadline,
// instead of an exception on an io thread that leaves the fetch waiting forever.
TEST(Integrity, ARefAnnouncingMoreThanTheMachineHasFailsPromptly) {
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto real = server.put(make_pattern(100, 3));
  ObjectRef forged = real;
  forged.metadata.tensors = {TensorMeta::bytes(uint64_t{16} << 40)};  // 16 TiB
  for (auto timeout : {0ms, 60000ms}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto req = peer.fetch(forged, {}, {.timeout = timeout});
    EXPECT_EQ(req.wait(scaled(10s)), errc::resource_exhausted) << "timeout " << timeout.count();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(2s));
  }
  // Sizes whose 64-byte rounded sum wraps to zero: 65,536 tensors of 2^48 - 1 bytes.
  forged.metadata.tensors.assign(65536, TensorMeta::bytes((uint64_t{1} << 48) - 1));
  EXPECT_EQ(peer.fetch(forged).wait(scaled(10s)), errc::resource_exhausted);
  // Just above what the machine has, in two tensors.
  const uint64_t half = physical_memory_bytes() / 2 + 4096;
  forged.metadata.tensors.assign(2, TensorMeta::bytes(half));
  EXPECT_EQ(peer.fetch(forged).wait(scaled(10s)), errc::resource_exhausted);
  // The peer is still usable.
  auto ok = peer.fetch(real);
  ASSERT_FALSE(ok.wait(scaled(10s)));
  EXPECT_TRUE(same_bytes(ok.result().tensors[0], *make_pattern(100, 3)));
}

}  // namespace
}  // namespace ferry::test
