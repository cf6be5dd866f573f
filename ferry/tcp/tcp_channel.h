// TcpChannel: one peer's TCP data channel (internal to the TCP transport).
//
// Receiving: between chunks the one read queued with Asio (waiting for the socket to be
// readable) goes into a staging buffer of 16 KiB that the channel owns; mid-payload the channel
// waits for readability; every other read is a non-blocking readv() inside a strand handler. So
// bytes land in a target buffer only while its fetch is live, and abort() on the strand is final:
// no read is in flight into a buffer once its request is gone. The staging buffer takes headers
// and small chunks whole; a large payload's remainder is received straight into its target (with
// the bytes after it into the staging buffer, in the same call), or, for a request that combines
// (FetchOp::combine), into a buffer of 128 KiB and combined into its target from there while the
// bytes are still in cache. A read that returns less than it asked for has emptied the socket, so
// the channel waits again without another.
//
// Sending: requests are served in chunks of `chunk_bytes`, each an async_write of {header,
// payload} straight from the pinned object; before each chunk the channel picks the oldest
// request, or one that a single chunk finishes (next_send()): a small request is not stuck behind
// a large one, and a window of large ones completes one after another rather than all together
// at its end, so the fetcher holds fewer partly received objects. A send of an object that counts
// its serves (PutOptions::on_served) completes when the fetcher acknowledges receipt (an empty
// TransportMessage on the metadata channel), not when its bytes are written: written bytes can
// still be lost with the connection.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ferry/net/coverage.h"
#include "ferry/net/transport.h"
#include "ferry/tcp/data_frame.h"

namespace ferry::tcp {

class TcpChannel final : public TransportChannel, public std::enable_shared_from_this<TcpChannel> {
 public:
  TcpChannel(std::shared_ptr<PeerLink> link, boost::asio::ip::tcp::socket socket,
             size_t chunk_bytes);

  // Sizes the staging buffer and starts reading. Strand.
  void start();

  // TransportChannel: strand, all of them. Receives are posted before the owner sends; the
  // owner streams its serves oldest first, short ones ahead; abort lets go of a request at once
  // (true).
  Result<FetchRequest> recv_multiple(const FetchOp& op) override;
  void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) override;
  bool abort(uint64_t request_id) override;
  // The fetcher's acknowledgement of a send that asked for one (an empty payload); a send this
  // channel no longer waits for (a broken connection ended it) is settled with the session.
  bool on_message(uint64_t request_id, std::string_view payload) override;
  void close(std::error_code ec) override;

  // The callback guard's view (ferry/net/core/guard.h). Strand. out_of_memory fails the
  // session (and this channel with it) with resource_exhausted.
  PeerStrand& strand() { return strand_; }
  std::shared_ptr<void> keep_alive() { return shared_from_this(); }
  bool closed() const { return closed_; }
  void out_of_memory();

 private:
  struct Recv {
    std::vector<MutableBuffer> targets;
    std::vector<Coverage> written;  // per target: the chunks' offsets may not overlap or leave gaps
    CombineFn combine;              // optional
    FetchRequest request;           // bytes landed are reported to it, per chunk
  };
  struct Send {
    uint64_t request_id = 0;
    ObjectStore::Pin object;
    SendDone done;
    size_t tensor = 0;
    uint64_t offset = 0;
    bool sent_end = false;
    bool ack = false;       // completes on the fetcher's acknowledgement
    bool acked = false;     // which came before the last chunk's write completed
    uint64_t left = 0;      // payload bytes not written yet
    uint64_t moved_at = 0;  // written_ when it was queued or last had a chunk written
  };
  enum class ReadState { header, payload };

  // Owner side: the fetcher's acknowledgement of a request arrived. False if no send of this
  // channel waits for it.
  bool on_ack(uint64_t request_id);

  // Waits for the socket to be readable: between chunks by a read queued into stage_, whose
  // handler parses it and reads on (on_readable) unless it emptied the socket; mid-payload by
  // async_wait, then on_readable. Strand.
  void arm_read();
  // Reads until the socket is empty (then arm_read) or a budget is spent (then posts itself).
  void on_readable();
  // Parses the first `n` bytes of stage_: headers, and payload bytes copied to their target.
  // Returns false when the channel failed.
  bool consume_stage(size_t n);
  // Returns false when the channel failed.
  bool on_header();
  // The current chunk's payload is complete: expect a header; finish the request at its end.
  void end_payload();
  // The current chunk was the request's last: complete it (every byte must have arrived).
  void finish_request();
  void fail(std::error_code ec);
  void pump();
  // The send to write a chunk of next (sends_ not empty): the oldest, unless one among the oldest
  // kPickWindow has at most a chunk left (the first such goes ahead), and always the oldest once
  // kBypassChunks chunks of others have been written since it last moved.
  std::deque<Send>::iterator next_send();
  std::deque<Send>::iterator find_send(uint64_t request_id);
  void finish_send(std::deque<Send>::iterator it, std::error_code ec);

  std::weak_ptr<PeerLink> link_;
  PeerStrand strand_;
  boost::asio::ip::tcp::socket socket_;
  const size_t chunk_bytes_;
  bool closed_ = false;

  // receive side
  std::unordered_map<uint64_t, Recv> recvs_;
  ReadState read_state_ = ReadState::header;
  DataHeader header_;
  size_t header_got_ = 0;
  std::byte* payload_dst_ = nullptr;  // null: discard (request aborted or unknown)
  uint64_t payload_left_ = 0;
  // The current chunk's request combines (FetchOp::combine): its bytes go through stage_ or
  // combining_ and this function into payload_dst_. Null otherwise.
  const CombineFn* combine_ = nullptr;
  std::vector<std::byte> scratch_;    // payload of dropped requests lands here
  std::vector<std::byte> stage_;      // kStageBytes from start(): headers and small chunks
  std::vector<std::byte> combining_;  // a combining request's payload on its way to the target

  // send side
  std::deque<Send> sends_;                               // in arrival order
  std::unordered_map<uint64_t, SendDone> awaiting_ack_;  // written, not yet acknowledged
  bool writing_ = false;
  uint64_t writing_request_ = 0;  // the send a chunk is being written of, while writing_
  uint64_t written_ = 0;          // payload bytes written, all sends
  DataHeader out_header_;
};

}  // namespace ferry::tcp
