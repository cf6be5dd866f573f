// The one place where ferry's threads hand work to Python.
//
// ferry's io threads never take the GIL and never run Python code. Whatever they must tell
// Python (a fetch completed; a Python object ferry held may now be dropped) goes into one
// process-wide queue; a single Python thread (ferry._completion) waits on it with the GIL
// released and handles each item with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <system_error>
#include <utility>

#include "ferry/net/fetch.h"

namespace ferry::python {

// What a fetch ended with, handed to Python as `_ferry.FetchOutcome`.
struct FetchOutcome {
  std::error_code ec;
  FetchResult result;
};

// A fetch's outcome and its Python future (`future`, an owned reference), for a thread that
// resolves the future with the GIL held (`future._ferry_complete(outcome)`). In the completion
// queue an item without an outcome only drops `future` (any object ferry held).
struct Completion {
  PyObject* future = nullptr;
  std::unique_ptr<FetchOutcome> outcome;
};

// Queues `obj` (an owned reference) to be dropped by the completion thread. Any thread; never
// takes the GIL; never blocks on Python.
void queue_drop(PyObject* obj) noexcept;
// Queues `target._ferry_complete(outcome)` (`target`: an owned reference). Any thread; never
// takes the GIL.
void queue_completion(PyObject* target, std::unique_ptr<FetchOutcome> outcome) noexcept;

// One strong reference to a Python object that any thread may destroy: created with the GIL
// held; its destructor (any thread, no GIL) hands the reference to the completion queue.
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(pybind11::object obj) : obj_(obj.release().ptr()) {}  // GIL held
  PyRef(PyRef&& other) noexcept : obj_(std::exchange(other.obj_, nullptr)) {}
  PyRef& operator=(PyRef&& other) noexcept {
    if (this != &other) {
      reset();
      obj_ = std::exchange(other.obj_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }

  // Gives up ownership of the reference (to a queue item). Any thread.
  PyObject* release() noexcept { return std::exchange(obj_, nullptr); }
  void reset() noexcept {
    if (obj_) queue_drop(std::exchange(obj_, nullptr));
  }

 private:
  PyObject* obj_ = nullptr;
};

}  // namespace ferry::python
