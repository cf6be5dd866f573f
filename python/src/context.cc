// `_ferry.Context` and `_ferry.Peer`: thin handles over ferry::Context and ferry::Peer for
// ferry/_context.py. Every call that can block (construct, listen, connect, close, hold,
// release, list) lets the GIL go while it runs; none runs Python on a ferry thread.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/cma/cma_transport.h"
#include "ferry/cma/options.h"
#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/stats.h"
#include "ferry/rdma/options.h"
#include "ferry/rdma/rdma.h"
#include "ferry/tcp/options.h"
#include "ferry/tcp/tcp_transport.h"
#include "python/src/bindings.h"
#include "python/src/completions.h"
#include "python/src/errors.h"
#include "python/src/fetch.h"

namespace py = pybind11;
using std::chrono::milliseconds;

namespace ferry::python {
namespace {

// Runs f() with the GIL released; its result is used after the GIL is back.

tcp::TcpOptions& tcp_options(ContextOptions& o) {
  return o.transport_options_for<tcp::TcpOptions>(tcp::kTransportName);
}
rdma::RdmaOptions& rdma_options(ContextOptions& o) {
  return o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName);
}
cma::CmaOptions& cma_options(ContextOptions& o) {
  return o.transport_options_for<cma::CmaOptions>(cma::kTransportName);
}
ContextOptions& core_options(ContextOptions& o) { return o; }

// Sets the field `Field` of what `Options` picks out of `o` (ContextOptions itself, or a
// transport's options) from `v`: a duration from milliseconds, any other field by its own type.
template <auto Field, auto Options = core_options>
void set_option(ContextOptions& o, const py::handle& v) {
  auto& field = Options(o).*Field;
  using T = std::remove_cvref_t<decltype(field)>;
  if constexpr (std::is_same_v<T, milliseconds>) {
    field = milliseconds(v.cast<int64_t>());
  } else if constexpr (std::is_same_v<T, std::chrono::microseconds>) {
    field = std::chrono::microseconds(v.cast<int64_t>());
  } else {
    field = v.cast<T>();
  }
}

void set_rdma_grants(ContextOptions& o, const py::handle& v) {
  auto grants = rdma::parse_rdma_grants(v.cast<std::string>());
  if (!grants) {
    throw py::value_error("rdma_grants must be auto, windows, registrations or regions");
  }
  rdma_options(o).grants = *grants;
}

void set_tls(ContextOptions& o, const py::handle& v) {
  using Paths = std::tuple<std::string, std::string, std::string>;
  auto [certificate, key_file, ca] = v.cast<Paths>();
  o.tls = TlsOptions{certificate, key_file, ca};
}

// Each keyword ferry.Context passes on, and what sets it: ContextOptions' own fields in their
// order there, then the TCP, RDMA and CMA transports' options.
using OptionSetter = void (*)(ContextOptions&, const py::handle&);
constexpr std::pair<std::string_view, OptionSetter> kOptionSetters[] = {
    {"name", set_option<&ContextOptions::name>},
    {"threads", set_option<&ContextOptions::threads>},
    {"transports", set_option<&ContextOptions::transports>},
    {"transport", set_option<&ContextOptions::transport>},
    {"max_frame_bytes", set_option<&ContextOptions::max_frame_bytes>},
    {"max_queued_control_bytes", set_option<&ContextOptions::max_queued_control_bytes>},
    {"max_requests_per_peer", set_option<&ContextOptions::max_requests_per_peer>},
    {"connect_timeout", set_option<&ContextOptions::connect_timeout>},
    {"handshake_timeout", set_option<&ContextOptions::handshake_timeout>},
    {"heartbeat_interval", set_option<&ContextOptions::heartbeat_interval>},
    {"peer_timeout", set_option<&ContextOptions::peer_timeout>},
    {"lease_timeout", set_option<&ContextOptions::lease_timeout>},
    {"pool_idle_trim", set_option<&ContextOptions::pool_idle_trim>},
    {"secret", set_option<&ContextOptions::secret>},
    {"tls", set_tls},
    {"pool_bytes", set_option<&ContextOptions::pool_bytes>},
    {"pool_populate_threads", set_option<&ContextOptions::pool_populate_threads>},
    {"idle_spin_us", set_option<&ContextOptions::idle_spin>},
    {"tcp_chunk_bytes", set_option<&tcp::TcpOptions::chunk_bytes, tcp_options>},
    {"tcp_congestion", set_option<&tcp::TcpOptions::congestion, tcp_options>},
    {"busy_poll", set_option<&rdma::RdmaOptions::busy_poll, rdma_options>},
    {"rdma_grants", set_rdma_grants},
    {"rdma_max_registration", set_option<&rdma::RdmaOptions::max_registration, rdma_options>},
    {"rdma_fork_protection", set_option<&rdma::RdmaOptions::fork_protection, rdma_options>},
    {"cma_preferred", set_option<&cma::CmaOptions::preferred, cma_options>},
    {"cma_copy_threads", set_option<&cma::CmaOptions::copy_threads, cma_options>},
};

// ContextOptions from the keyword arguments ferry.Context passed on (durations already in ms);
// an option left out keeps what the environment gives it (ContextOptions::from_environment). The
// TCP, RDMA and CMA ones go to those transports' options.
ContextOptions options_from(const py::dict& given) {
  ContextOptions o = ContextOptions::from_environment();
  for (const auto& [k, v] : given) {
    const auto key = k.cast<std::string>();
    auto setter =
        std::ranges::find(kOptionSetters, key, &std::pair<std::string_view, OptionSetter>::first);
    if (setter == std::end(kOptionSetters)) {
      throw py::value_error("unknown Context option: " + key);
    }
    setter->second(o, v);
  }
  return o;
}

// What C++ peers see of a tensor: ferry's dtype and the shape, or raw bytes (dtype -1: one
// ferry has no name for, e.g. numpy uint32; the Python description in ferry.ObjectRef keeps it).
TensorMeta meta_of(int dtype, const std::vector<int64_t>& shape, uint64_t nbytes) {
  if (dtype < 0) return TensorMeta::bytes(nbytes);
  auto d = static_cast<DType>(dtype);
  if (dtype_size(d) == 0) throw py::value_error("unknown ferry dtype " + std::to_string(dtype));
  TensorMeta m = TensorMeta::dense(shape, d);
  if (m.nbytes != nbytes) throw py::value_error("tensor shape and dtype do not match its bytes");
  return m;
}

// A fetch's options from what ferry.Peer.fetch passes: milliseconds (< 0: none), a transport
// name ("" or "auto": the negotiated one) and whether to check the owner's checksums.
FetchOptions fetch_options(int64_t timeout_ms, std::string transport, bool verify) {
  FetchOptions options;
  options.timeout = milliseconds(timeout_ms);
  options.transport = std::move(transport);
  options.verify = verify;
  return options;
}

class PeerHandle {
 public:
  PeerHandle(Peer peer, std::shared_ptr<InflightFetches> inflight, std::string address,
             WaitMode wait_mode)
      : peer_(std::move(peer)),
        inflight_(std::move(inflight)),
        address_(std::move(address)),
        wait_mode_(std::move(wait_mode)) {}
  PeerHandle(const PeerHandle&) = delete;
  PeerHandle& operator=(const PeerHandle&) = delete;
  // The Python Peer is gone: so is its connection (no fetch of it is in flight, since each
  // keeps its Python Peer alive).
  ~PeerHandle() { peer_.close(); }

  const std::string& address() const { return address_; }
  bool is_open() const { return peer_.is_open(); }
  std::string transport() const { return peer_.transport(); }

  NativeFetch fetch(ObjectRef ref, const std::vector<std::pair<uintptr_t, size_t>>& targets,
                    int64_t timeout_ms, std::string transport, bool verify, py::object future) {
    std::vector<MutableBuffer> buffers;
    buffers.reserve(targets.size());
    for (const auto& [address, size] : targets) {
      buffers.emplace_back(reinterpret_cast<std::byte*>(address), size);
    }
    return start_fetch(peer_, inflight_, std::move(ref), std::move(buffers),
                       fetch_options(timeout_ms, std::move(transport), verify), std::move(future),
                       wait_mode_);
  }

  // fetch() into one numpy array for a ref of one tensor, the common case checked here rather
  // than in Python (ferry.Peer.fetch): None, with nothing started, when the array is not
  // C-contiguous, not writable, not the tensor's size or of a dtype that may hold objects
  // (object, structured); the general path then says what is wrong, or takes it.
  std::optional<NativeFetch> fetch_array(const ObjectRef& ref, py::array into, int64_t timeout_ms,
                                         std::string transport, bool verify, py::object future) {
    const auto& tensors = ref.metadata.tensors;
    const py::dtype dtype = into.dtype();
    if (tensors.size() != 1 || !(into.flags() & py::array::c_style) || !into.writeable() ||
        static_cast<uint64_t>(into.nbytes()) != tensors[0].nbytes || dtype.kind() == 'O' ||
        dtype.has_fields()) {
      return std::nullopt;
    }
    std::vector<MutableBuffer> buffers{
        MutableBuffer(static_cast<std::byte*>(into.mutable_data()), tensors[0].nbytes)};
    return start_fetch(peer_, inflight_, ref, std::move(buffers),
                       fetch_options(timeout_ms, std::move(transport), verify), std::move(future),
                       wait_mode_);
  }

  void hold(const ObjectRef& ref, int64_t timeout_ms) {
    auto ec = without_gil([&] { return peer_.hold(ref, milliseconds(timeout_ms)); });
    if (ec) raise_error(ec, "hold");
  }

  void release(const ObjectRef& ref, int64_t timeout_ms) {
    auto ec = without_gil([&] { return peer_.release(ref, milliseconds(timeout_ms)); });
    if (ec) raise_error(ec, "release");
  }

  std::vector<ObjectRef> list(int64_t timeout_ms) {
    auto refs = without_gil([&] { return peer_.list(milliseconds(timeout_ms)); });
    if (!refs) raise_error(refs.error(), "list");
    return std::move(refs).value();
  }

  void close() { peer_.close(); }

 private:
  Peer peer_;
  std::shared_ptr<InflightFetches> inflight_;
  std::string address_;
  WaitMode wait_mode_;
};

// PoolStats as a dict keyed by the field names.
py::dict pool_dict(const PoolStats& s) {
  static constexpr std::pair<const char*, uint64_t PoolStats::*> kFields[] = {
      {"held_bytes", &PoolStats::held_bytes},
      {"in_use_bytes", &PoolStats::in_use_bytes},
      {"hits", &PoolStats::hits},
      {"misses", &PoolStats::misses},
      {"fallbacks", &PoolStats::fallbacks},
      {"fallback_bytes", &PoolStats::fallback_bytes},
      {"regions_created", &PoolStats::regions_created},
      {"regions_trimmed", &PoolStats::regions_trimmed},
  };
  py::dict d;
  for (const auto& [name, field] : kFields) d[name] = s.*field;
  return d;
}

class ContextHandle {
 public:
  // `given`: ContextOptions as options_from() takes them, and how a thread waits for a fetch
  // (WaitMode): "wait_runs_loop" and "wait_linger_us" (ferry.Context checks and defaults them).
  explicit ContextHandle(py::dict given) {
    given = given.attr("copy")();
    const bool run_loop_in_wait = given.attr("pop")("wait_runs_loop").cast<bool>();
    const std::chrono::microseconds wait_linger(
        given.attr("pop")("wait_linger_us").cast<int64_t>());
    ContextOptions options = options_from(given);
    std::error_code thrown;
    std::string what;
    auto made = without_gil([&]() -> Result<std::unique_ptr<Context>> {
      try {
        return Context::create(std::move(options));
      } catch (const std::system_error& e) {  // TLS files that cannot be loaded
        thrown = e.code();
        what = e.what();
        return thrown;
      }
    });
    if (thrown) raise_error(thrown, what);
    if (!made) raise_error(made.error(), "Context");
    ctx_ = std::shared_ptr<Context>(std::move(made).value());
    if (run_loop_in_wait) wait_mode_ = WaitMode{ctx_, wait_linger};
  }

  // Python dropped the context (GIL held): close it, without the GIL, if it is still open.
  ~ContextHandle() { close(); }

  uint16_t listen(const std::string& host_port) {
    auto c = ctx();
    auto port = without_gil([&] { return c->listen(host_port); });
    if (!port) raise_error(port.error(), "listen on " + host_port);
    return *port;
  }

  std::string address() { return ctx()->address(); }
  void set_advertise_address(std::string host_port) {
    ctx()->set_advertise_address(std::move(host_port));
  }

  // tensors: (address, nbytes, ferry dtype or -1 for raw bytes, shape). `keepalive` is held
  // until the object is collected, then dropped on the completion thread.
  using TensorArg = std::tuple<uintptr_t, uint64_t, int, std::vector<int64_t>>;
  ObjectRef put(const std::vector<TensorArg>& tensors, py::object keepalive, std::string transport,
                bool exclusive, bool copy, std::string name, bool checksum) {
    auto c = ctx();
    std::vector<Tensor> views;
    views.reserve(tensors.size());
    for (const auto& [address, nbytes, dtype, shape] : tensors) {
      views.push_back(Tensor{{reinterpret_cast<const std::byte*>(address), nbytes},
                             meta_of(dtype, shape, nbytes)});
    }
    std::shared_ptr<void> owner;
    if (!copy && !keepalive.is_none()) {
      owner = std::shared_ptr<void>(keepalive.release().ptr(),
                                    [](void* obj) { queue_drop(static_cast<PyObject*>(obj)); });
    }
    PutOptions options;
    options.transport = std::move(transport);
    options.exclusive = exclusive;
    options.copy = copy;
    options.name = std::move(name);
    options.checksum = checksum;
    auto ref =
        without_gil([&] { return c->put(std::move(views), std::move(owner), std::move(options)); });
    if (!ref) raise_error(ref.error(), "put");
    return std::move(ref).value();
  }

  bool release(const ObjectRef& ref) {
    auto c = ctx();
    NativeCall nogil;
    return c->release(ref);
  }

  bool abort_serving(const ObjectRef& ref) {
    auto c = ctx();
    NativeCall nogil;
    return c->abort_serving(ref);
  }

  std::vector<ObjectRef> refs() { return ctx()->refs(); }

  std::unique_ptr<PeerHandle> connect(const std::string& address) {
    auto c = ctx();
    auto peer = without_gil([&] { return c->connect(address); });
    if (!peer) raise_error(peer.error(), "connect to " + address);
    return std::make_unique<PeerHandle>(std::move(peer).value(), inflight_, address, wait_mode_);
  }

  // Idempotent. Fetches whose completion will never come fail with context_closed. GIL held.
  // In a process forked from the one that made it, the context is let go of without closing:
  // its sockets and its epoll set are shared with the parent (shutting them down there would
  // end the parent's connections), and its io threads do not exist there (close would wait for
  // them). Its memory stays allocated in the child.
  void close() {
    if (!ctx_) return;
    if (::getpid() != pid_) {
      new std::shared_ptr<Context>(std::move(ctx_));  // NOLINT: deliberately never freed
      return;
    }
    auto ctx = std::move(ctx_);  // from here other calls raise context_closed
    NativeCall nogil;
    shut(std::move(ctx));
  }
  bool closed() const { return !ctx_; }
  // The context itself, for the collective bindings (they keep it alive while they use it).
  // GIL held; ferry.ContextClosedError once closed.
  std::shared_ptr<Context> shared() { return ctx(); }

  std::vector<std::string> transports() { return ctx()->transports(); }
  size_t peer_count() { return ctx()->peer_count(); }
  size_t inflight() const { return inflight_->size(); }
  py::dict pool_stats() { return pool_dict(ctx()->pool_stats()); }
  py::dict stats() {
    const Stats s = ctx()->stats();
    py::dict d;
    d["fetches_succeeded"] = s.fetches_succeeded;
    d["fetches_failed"] = s.fetches_failed;
    d["bytes_fetched"] = s.bytes_fetched;
    d["fetch_errors"] = s.fetch_errors;
    d["bytes_fetched_by_transport"] = s.bytes_fetched_by_transport;
    d["fetch_latency_count"] = s.fetch_latency.count;
    d["fetch_latency_sum_seconds"] = s.fetch_latency.sum_seconds;
    d["serves_succeeded"] = s.serves_succeeded;
    d["serves_failed"] = s.serves_failed;
    d["fetches_in_flight"] = s.fetches_in_flight;
    d["serves_in_flight"] = s.serves_in_flight;
    d["bytes_served"] = s.bytes_served;
    d["serve_errors"] = s.serve_errors;
    d["bytes_served_by_transport"] = s.bytes_served_by_transport;
    d["connections_by_transport"] = s.connections_by_transport;
    d["peers"] = s.peers;
    d["pool"] = pool_dict(s.pool);
    py::dict transports;
    for (const auto& [name, metrics] : s.transport_metrics) {
      py::dict m;
      for (const auto& metric : metrics) m[py::str(metric.name)] = metric.value;
      transports[py::str(name)] = m;
    }
    d["transport_metrics"] = transports;
    return d;
  }
  std::string prometheus_text(const std::string& labels) {
    return ferry::prometheus_text(ctx()->stats(), "ferry", labels);
  }

 private:
  pid_t pid_ = ::getpid();  // the process that made it (close() in another only lets go)
  // The context, for one call (a concurrent close() leaves it to that call). GIL held.
  std::shared_ptr<Context> ctx() {
    if (!ctx_) raise_error(make_error_code(errc::context_closed));
    return ctx_;
  }

  // Closes `ctx`, fails the fetches that will never complete, and lets the store go (the
  // objects put, once no Peer handle keeps the context's state either). GIL released.
  void shut(std::shared_ptr<Context> ctx) {
    ctx->close();  // joins the io threads: every handler has run or never will
    inflight_->fail_all(make_error_code(errc::context_closed));
    ctx.reset();  // destroyed here unless a call in flight on another thread still has it
  }

  std::shared_ptr<Context> ctx_;  // null once closed; read and written with the GIL held
  std::shared_ptr<InflightFetches> inflight_ = std::make_shared<InflightFetches>();
  WaitMode wait_mode_;  // what each Peer's fetches wait with (the context held weakly)
};

}  // namespace

std::shared_ptr<Context> native_context(py::handle context) {
  return context.cast<ContextHandle&>().shared();
}

void bind_context(py::module_& m) {
  py::class_<PeerHandle>(m, "Peer", "ferry::Peer (see ferry.Peer)")
      .def_property_readonly("address", &PeerHandle::address)
      .def_property_readonly("is_open", &PeerHandle::is_open)
      .def_property_readonly("transport", &PeerHandle::transport)
      .def("fetch", &PeerHandle::fetch, py::arg("ref"), py::arg("targets"), py::arg("timeout_ms"),
           py::arg("transport"), py::arg("verify"), py::arg("future"))
      .def("fetch_array", &PeerHandle::fetch_array, py::arg("ref"), py::arg("into"),
           py::arg("timeout_ms"), py::arg("transport"), py::arg("verify"), py::arg("future"))
      .def("hold", &PeerHandle::hold)
      .def("release", &PeerHandle::release)
      .def("list", &PeerHandle::list)
      .def("close", &PeerHandle::close);

  py::class_<ContextHandle>(m, "Context", "ferry::Context (see ferry.Context)")
      .def(py::init<py::dict>(), py::arg("options"))
      .def("listen", &ContextHandle::listen)
      .def_property_readonly("address", &ContextHandle::address)
      .def("set_advertise_address", &ContextHandle::set_advertise_address)
      .def("put", &ContextHandle::put, py::arg("tensors"), py::arg("keepalive"),
           py::arg("transport"), py::arg("exclusive"), py::arg("copy"), py::arg("name"),
           py::arg("checksum"))
      .def("release", &ContextHandle::release)
      .def("refs", &ContextHandle::refs)
      .def("connect", &ContextHandle::connect)
      .def("close", &ContextHandle::close)
      .def_property_readonly("closed", &ContextHandle::closed)
      .def("transports", &ContextHandle::transports)
      .def("peer_count", &ContextHandle::peer_count)
      .def("inflight", &ContextHandle::inflight)
      .def("pool_stats", &ContextHandle::pool_stats)
      .def("abort_serving", &ContextHandle::abort_serving)
      .def("stats", &ContextHandle::stats)
      .def("prometheus_text", &ContextHandle::prometheus_text, py::arg("labels"));
}

}  // namespace ferry::python
