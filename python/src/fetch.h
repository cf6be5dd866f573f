// Fetches started from Python: each resolves its Python future exactly once, through the
// completion queue, from ferry's completion handler or, when a context closes with the handler
// never run, from the context's sweep.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ferry/net/fetch.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/peer.h"
#include "python/src/completions.h"

namespace ferry::python {

// One fetch's Python future. finish() hands it to the completion queue; the first call wins.
class PendingFetch {
 public:
  explicit PendingFetch(PyRef future) : future_(std::move(future)) {}
  // Any thread; never takes the GIL.
  bool finish(std::error_code ec, FetchResult result);

 private:
  std::atomic<bool> finished_{false};
  PyRef future_;
};

// The fetches in flight of one context, so that close() can fail those whose completion
// handler will never run (the io_context stopped with it queued). Thread-safe.
class InflightFetches {
 public:
  uint64_t add(std::shared_ptr<PendingFetch> fetch);
  void remove(uint64_t key);
  // Finishes every fetch still registered with `ec`.
  void fail_all(std::error_code ec);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<PendingFetch>> fetches_;
};

// Starts fetching `ref` from `peer` into `targets` (empty: ferry allocates); `future` gets
// `_ferry_complete(FetchOutcome)` on the completion thread. GIL held (for `future`); does not
// block.
FetchRequest start_fetch(const Peer& peer, const std::shared_ptr<InflightFetches>& inflight,
                         ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                         pybind11::object future);

}  // namespace ferry::python
