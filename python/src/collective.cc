// `_ferry.collective`: Group, Service, Driver and Submitted, thin handles over
// ferry::collective (ferry/collective/group.h, ferry/collective/service.h) for ferry/collective.py.
//
// Every call that can block (join, the collectives, close, a Service's start and stop, a
// Driver's creation and submissions, waiting for a submission) lets the GIL go while it runs;
// no ferry thread runs Python. Buffers come as (address, nbytes) from Python, which checked
// them (contiguous, writable, sizes, dtype) and keeps their objects alive for the call.
//
// Lifetimes: a Group, the Service serving it and the Context under both are shared (Joined):
// the Context lives until the last of them goes, the Service stops before its Group is
// destroyed, and the Group before its Context. Whatever is destroyed is destroyed without the
// GIL (a Group's destructor waits for its watches; a Service's for the command in progress).
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/collective/group.h"
#include "ferry/collective/service.h"
#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "python/src/bindings.h"
#include "python/src/errors.h"

namespace py = pybind11;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace ferry::python {
namespace {

using collective::Driver;
using collective::Group;
using collective::GroupOptions;
using collective::ReduceOp;
using collective::Service;
using collective::Status;
using collective::Submitted;

// Drops `p` (whose destructor may block) without the GIL when this thread holds it. `p` is
// emptied first, with the GIL still held: other threads read it with the GIL held.
template <typename P>
void reset_without_gil(P& p) {
  auto gone = std::move(p);
  if (Py_IsInitialized() && PyGILState_Check()) {
    NativeCall nogil;
    gone.reset();
  }
}

// None for ok, else (error_info(ec), rank, message): ferry/collective.py builds the exception.
// GIL held.
py::object status_object(const Status& s) {
  if (s.ok()) return py::none();
  return py::make_tuple(error_info(s.ec), s.rank, s.message);
}

DType dtype_of(int dtype) {
  if (dtype < 0 || dtype_size(static_cast<DType>(dtype)) == 0) {
    throw py::value_error("unknown ferry dtype " + std::to_string(dtype));
  }
  return static_cast<DType>(dtype);
}

ReduceOp op_of(int op) {
  if (op < static_cast<int>(ReduceOp::kSum) || op > static_cast<int>(ReduceOp::kMax)) {
    throw py::value_error("unknown reduce op " + std::to_string(op));
  }
  return static_cast<ReduceOp>(op);
}

// GroupOptions from the keyword arguments ferry.collective.Group.join passed on (durations
// already in ms / us); an option left out keeps the C++ default.
GroupOptions group_options(const py::dict& given) {
  GroupOptions o;
  for (const auto& [k, v] : given) {
    const auto key = k.cast<std::string>();
    if (key == "name")
      o.name = v.cast<std::string>();
    else if (key == "join_timeout_ms")
      o.join_timeout = milliseconds(v.cast<int64_t>());
    else if (key == "timeout_ms")
      o.timeout = milliseconds(v.cast<int64_t>());
    else if (key == "doubling_threshold")
      o.doubling_threshold = v.cast<size_t>();
    else if (key == "ring_threshold")
      o.ring_threshold = v.cast<size_t>();
    else if (key == "segment_bytes")
      o.segment_bytes = v.cast<size_t>();
    else if (key == "busy_wait")
      o.busy_wait = v.cast<bool>();
    else if (key == "busy_wait_below")
      o.busy_wait_below = v.cast<size_t>();
    else if (key == "busy_spin_us")
      o.busy_spin = microseconds(v.cast<int64_t>());
    else if (key == "busy_linger_us")
      o.busy_linger = microseconds(v.cast<int64_t>());
    else
      throw py::value_error("unknown GroupOptions field: " + key);
  }
  if (o.segment_bytes == 0) throw py::value_error("segment_bytes must be > 0");
  return o;
}

// GroupOptions' defaults, in the units Python uses (seconds), for ferry/collective.py's
// signature check and help.
py::dict group_defaults() {
  const GroupOptions o;
  using seconds = std::chrono::duration<double>;
  py::dict d;
  d["name"] = o.name;
  d["join_timeout"] = std::chrono::duration_cast<seconds>(o.join_timeout).count();
  d["timeout"] = std::chrono::duration_cast<seconds>(o.timeout).count();
  d["doubling_threshold"] = o.doubling_threshold;
  d["ring_threshold"] = o.ring_threshold;
  d["segment_bytes"] = o.segment_bytes;
  d["busy_wait"] = o.busy_wait;
  d["busy_wait_below"] = o.busy_wait_below ? py::cast(*o.busy_wait_below) : py::none();
  d["busy_spin"] = std::chrono::duration_cast<seconds>(o.busy_spin).count();
  d["busy_linger"] = std::chrono::duration_cast<seconds>(o.busy_linger).count();
  return d;
}

// A joined Group with the Context it runs on. Members are destroyed in reverse order: the Group
// before the Context.
struct Joined {
  std::shared_ptr<Context> ctx;
  std::unique_ptr<Group> group;
  std::mutex mu;         // held by the call in progress (a Group is used by one thread at a time)
  bool serving = false;  // a Service runs on the Group (guarded by mu)
};

class GroupHandle {
 public:
  explicit GroupHandle(std::shared_ptr<Joined> joined) : joined_(std::move(joined)) {
    rank_ = joined_->group->rank();
    size_ = joined_->group->size();
  }
  GroupHandle(const GroupHandle&) = delete;
  GroupHandle& operator=(const GroupHandle&) = delete;
  ~GroupHandle() { reset_without_gil(joined_); }

  // (GroupHandle, None) or (None, status): Group::join, GIL released.
  static py::tuple join(py::handle context, std::vector<std::string> addresses, int rank,
                        const py::dict& options) {
    auto ctx = native_context(context);
    GroupOptions o = group_options(options);
    Status why;
    auto joined = std::make_shared<Joined>();
    joined->ctx = ctx;
    auto group =
        without_gil([&] { return Group::join(*ctx, std::move(addresses), rank, o, &why); });
    if (!group) {
      if (why.ok()) why = {group.error(), -1, "join"};
      reset_without_gil(joined);
      return py::make_tuple(py::none(), status_object(why));
    }
    joined->group = std::move(group).value();
    return py::make_tuple(std::make_unique<GroupHandle>(std::move(joined)), py::none());
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool closed() const { return !joined_; }
  uint64_t refetches() { return joined()->group->refetches(); }

  py::object allreduce(uintptr_t address, size_t nbytes, int dtype, int op) {
    const DType d = dtype_of(dtype);
    const ReduceOp o = op_of(op);
    return call([&](Group& g) { return g.allreduce({as_bytes(address), nbytes}, d, o); });
  }

  py::object broadcast(uintptr_t address, size_t nbytes, int root) {
    return call([&](Group& g) { return g.broadcast({as_bytes(address), nbytes}, root); });
  }

  py::object allgather(uintptr_t in, size_t in_bytes, uintptr_t out, size_t out_bytes) {
    return call([&](Group& g) {
      return g.allgather({as_bytes(in), in_bytes}, {as_bytes(out), out_bytes});
    });
  }

  py::object reduce_scatter(uintptr_t in, size_t in_bytes, uintptr_t out, size_t out_bytes,
                            int dtype, int op) {
    const DType d = dtype_of(dtype);
    const ReduceOp o = op_of(op);
    return call([&](Group& g) {
      return g.reduce_scatter({as_bytes(in), in_bytes}, {as_bytes(out), out_bytes}, d, o);
    });
  }

  // Idempotent. Destroys the Group (GIL released; its watches end, bounded by the context's
  // lease_timeout) unless a call in progress on another thread or a Service still has it: then
  // the last of them does.
  void close() { reset_without_gil(joined_); }

  // The shared state, for a Service. GIL held.
  std::shared_ptr<Joined> joined() {
    if (!joined_) throw py::value_error("the collective group is closed");
    return joined_;
  }

 private:
  static std::byte* as_bytes(uintptr_t address) { return reinterpret_cast<std::byte*>(address); }

  // Runs f(group) with the GIL released, one call at a time; RuntimeError while a Service
  // serves the Group.
  template <typename F>
  py::object call(F&& f) {
    auto j = joined();
    std::optional<Status> s = without_gil([&] {
      std::optional<Status> r;
      {
        std::lock_guard lock(j->mu);
        if (!j->serving) r = f(*j->group);
      }
      j.reset();  // the last reference when close() came meanwhile: destroyed without the GIL
      return r;
    });
    if (!s) {
      throw std::runtime_error(
          "the group is serving a driver (ferry.collective.Service): stop the Service before "
          "calling collectives on it");
    }
    return status_object(*s);
  }

  std::shared_ptr<Joined> joined_;  // null once closed; read and written with the GIL held
  int rank_ = 0;
  int size_ = 0;
};

class ServiceHandle {
 public:
  ServiceHandle(GroupHandle& group, py::handle context, std::string driver_address,
                std::string name) {
    auto joined = group.joined();
    if (native_context(context) != joined->ctx) {
      throw py::value_error("the context is not the one the group was joined on");
    }
    const bool started = without_gil([&] {
      std::lock_guard lock(joined->mu);
      if (joined->serving) return false;
      // Marked serving only once it serves: a Service that fails to start (no thread) leaves
      // the group usable.
      service_ = std::make_unique<Service>(*joined->ctx, *joined->group, std::move(driver_address),
                                           std::move(name));
      joined->serving = true;
      return true;
    });
    if (!started) {
      reset_without_gil(joined);
      throw std::runtime_error("a ferry.collective.Service already serves this group");
    }
    joined_ = std::move(joined);
  }
  ServiceHandle(const ServiceHandle&) = delete;
  ServiceHandle& operator=(const ServiceHandle&) = delete;
  ~ServiceHandle() { stop(); }

  // Idempotent: stops after the command in progress (GIL released) and hands the Group back.
  void stop() {
    if (!joined_) return;
    auto joined = std::move(joined_);
    NativeCall nogil;
    service_.reset();
    {
      std::lock_guard lock(joined->mu);
      joined->serving = false;
    }
    joined.reset();
  }
  bool stopped() const { return !joined_; }

 private:
  std::shared_ptr<Joined> joined_;  // null once stopped
  std::unique_ptr<Service> service_;
};

class SubmittedHandle {
 public:
  explicit SubmittedHandle(Submitted s) : s_(std::make_unique<Submitted>(std::move(s))) {}
  SubmittedHandle(const SubmittedHandle&) = delete;
  SubmittedHandle& operator=(const SubmittedHandle&) = delete;
  // The done future's last holder may wait for the thread behind it (std::async).
  ~SubmittedHandle() { reset_without_gil(s_); }

  uint64_t id() const { return s_->id; }
  const std::vector<ObjectRef>& results() const { return s_->results; }
  const Submitted& submitted() const { return *s_; }

  // Whether the outcome is in, after waiting up to timeout_ms (< 0: until it is). GIL released.
  bool wait(int64_t timeout_ms) {
    const auto& done = s_->done;
    return without_gil([&] {
      if (timeout_ms < 0) {
        done.wait();
        return true;
      }
      return done.wait_for(milliseconds(timeout_ms)) == std::future_status::ready;
    });
  }

  // None or (error_info, rank, message); only once wait() said it is in.
  py::object status() {
    if (s_->done.wait_for(milliseconds(0)) != std::future_status::ready) {
      throw std::runtime_error("the collective has not finished yet");
    }
    return status_object(s_->done.get());
  }

 private:
  std::unique_ptr<Submitted> s_;
};

class DriverHandle {
 public:
  DriverHandle(py::handle context, std::vector<std::string> ranks, std::string name,
               int64_t timeout_ms) {
    ctx_ = native_context(context);
    if (ctx_->address().empty()) {
      throw py::value_error("the driver's context must listen (the services fetch from it)");
    }
    auto made = without_gil([&] {
      return Driver::create(*ctx_, std::move(ranks), std::move(name), milliseconds(timeout_ms));
    });
    if (!made) raise_error(made.error(), "collective Driver");
    driver_ = std::shared_ptr<Driver>(std::move(made).value());
  }
  DriverHandle(const DriverHandle&) = delete;
  DriverHandle& operator=(const DriverHandle&) = delete;
  ~DriverHandle() { close(); }

  using Refs = std::vector<std::optional<ObjectRef>>;

  std::unique_ptr<SubmittedHandle> allreduce(const Refs& refs, int dtype, int op) {
    const DType d = dtype_of(dtype);
    const ReduceOp o = op_of(op);
    return submit(refs, [&](Driver& dr, const auto& r) { return dr.allreduce(r, d, o); });
  }
  std::unique_ptr<SubmittedHandle> broadcast(const Refs& refs, int root) {
    if (root < 0 || static_cast<size_t>(root) >= refs.size() || !refs[root]) {
      throw py::value_error("broadcast: no ref for the root");
    }
    return submit(refs, [&](Driver& dr, const auto& r) { return dr.broadcast(r, root); });
  }
  std::unique_ptr<SubmittedHandle> allgather(const Refs& refs) {
    return submit(refs, [&](Driver& dr, const auto& r) { return dr.allgather(r); });
  }
  std::unique_ptr<SubmittedHandle> reduce_scatter(const Refs& refs, int dtype, int op) {
    const DType d = dtype_of(dtype);
    const ReduceOp o = op_of(op);
    return submit(refs, [&](Driver& dr, const auto& r) { return dr.reduce_scatter(r, d, o); });
  }

  void release(const SubmittedHandle& s) {
    auto d = driver();
    without_gil([&] {
      {
        std::lock_guard lock(mu_);
        d->release(s.submitted());
      }
      d.reset();
    });
  }

  // Idempotent (GIL released). Submissions in flight still complete (failed, if the ranks no
  // longer find their commands), within the driver's timeout.
  void close() { reset_without_gil(driver_); }
  bool closed() const { return !driver_; }

 private:
  // The Driver, for one call (a concurrent close() leaves it to that call). GIL held.
  std::shared_ptr<Driver> driver() {
    if (!driver_) throw py::value_error("the collective driver is closed");
    return driver_;
  }

  template <typename F>
  std::unique_ptr<SubmittedHandle> submit(const Refs& refs, F&& f) {
    auto d = driver();
    std::vector<ObjectRef> plain;
    plain.reserve(refs.size());
    for (const auto& r : refs) plain.push_back(r ? *r : ObjectRef{});
    auto s = without_gil([&] {
      Submitted made;
      {
        std::lock_guard lock(mu_);
        made = f(*d, plain);
      }
      d.reset();  // the last reference when close() came meanwhile: destroyed without the GIL
      return made;
    });
    return std::make_unique<SubmittedHandle>(std::move(s));
  }

  std::shared_ptr<Context> ctx_;    // declared first: destroyed after the Driver
  std::shared_ptr<Driver> driver_;  // null once closed; read and written with the GIL held
  std::mutex mu_;  // one submission at a time (a Driver is used by one thread at a time)
};

}  // namespace

void bind_collective(py::module_& m) {
  auto c = m.def_submodule("collective", "ferry::collective (see ferry.collective)");
  c.def("group_defaults", &group_defaults, "GroupOptions' defaults (durations in seconds).");
  c.def(
      "chunk_range",
      [](size_t count, int rank, int size) {
        if (size < 1 || rank < 0 || rank >= size) throw py::value_error("rank out of range");
        return Group::chunk_range(count, rank, size);
      },
      "Group::chunk_range: elements [first, last) of `count` for `rank` of `size`.");

  py::class_<GroupHandle>(c, "Group", "ferry::collective::Group (see ferry.collective.Group)")
      .def_static("join", &GroupHandle::join, py::arg("context"), py::arg("addresses"),
                  py::arg("rank"), py::arg("options"))
      .def_property_readonly("rank", &GroupHandle::rank)
      .def_property_readonly("size", &GroupHandle::size)
      .def_property_readonly("closed", &GroupHandle::closed)
      .def_property_readonly("refetches", &GroupHandle::refetches)
      .def("allreduce", &GroupHandle::allreduce)
      .def("broadcast", &GroupHandle::broadcast)
      .def("allgather", &GroupHandle::allgather)
      .def("reduce_scatter", &GroupHandle::reduce_scatter)
      .def("close", &GroupHandle::close);

  py::class_<ServiceHandle>(c, "Service", "ferry::collective::Service")
      .def(py::init<GroupHandle&, py::handle, std::string, std::string>(), py::arg("group"),
           py::arg("context"), py::arg("driver_address"), py::arg("name"))
      .def("stop", &ServiceHandle::stop)
      .def_property_readonly("stopped", &ServiceHandle::stopped);

  py::class_<SubmittedHandle>(c, "Submitted", "ferry::collective::Submitted")
      .def_property_readonly("id", &SubmittedHandle::id)
      .def_property_readonly("results", &SubmittedHandle::results)
      .def("wait", &SubmittedHandle::wait, py::arg("timeout_ms"))
      .def("status", &SubmittedHandle::status);

  py::class_<DriverHandle>(c, "Driver", "ferry::collective::Driver")
      .def(py::init<py::handle, std::vector<std::string>, std::string, int64_t>(),
           py::arg("context"), py::arg("ranks"), py::arg("name"), py::arg("timeout_ms"))
      .def("allreduce", &DriverHandle::allreduce)
      .def("broadcast", &DriverHandle::broadcast)
      .def("allgather", &DriverHandle::allgather)
      .def("reduce_scatter", &DriverHandle::reduce_scatter)
      .def("release", &DriverHandle::release)
      .def("close", &DriverHandle::close)
      .def_property_readonly("closed", &DriverHandle::closed);
}

}  // namespace ferry::python
