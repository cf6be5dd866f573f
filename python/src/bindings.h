// The pieces of the `ferry._ferry` extension module, one binder per file.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>

namespace ferry {
class Context;
}

namespace ferry::python {

void bind_errors(pybind11::module_& m);       // errors.cc
void bind_completions(pybind11::module_& m);  // completions.cc
void bind_object_ref(pybind11::module_& m);   // object_ref.cc
void bind_fetch(pybind11::module_& m);        // fetch.cc
void bind_context(pybind11::module_& m);      // context.cc
void bind_collective(pybind11::module_& m);   // collective.cc

// The ferry::Context behind a `_ferry.Context` (context.cc), shared with the caller, which may
// keep it alive past the Python object's close(). GIL held; ferry.ContextClosedError once it is
// closed, TypeError for another object.
std::shared_ptr<Context> native_context(pybind11::handle context);

// Threads now inside a call that let the GIL go (NativeCall), read by `_threads_in_native`
// (completions.cc). The exit hook waits until none is left before the interpreter stops its
// daemon threads: a daemon thread still inside one when the interpreter finalizes is ended
// (pthread_exit) as it takes the GIL back, in a destructor that must not unwind, and the process
// aborts (std::terminate).
inline std::atomic<int> threads_in_native{0};

// The GIL let go for the scope of a call into ferry, counted in threads_in_native from before
// it is let go until after it is taken back. GIL held on construction and destruction.
class NativeCall {
 public:
  NativeCall() = default;
  NativeCall(const NativeCall&) = delete;
  NativeCall& operator=(const NativeCall&) = delete;

 private:
  struct Counted {
    Counted() { threads_in_native.fetch_add(1); }
    ~Counted() { threads_in_native.fetch_sub(1); }
  } counted_;                              // constructed first, destroyed last
  pybind11::gil_scoped_release released_;  // taken back before counted_ goes
};

// Runs `f` in a NativeCall. GIL held.
template <typename F>
auto without_gil(F&& f) {
  NativeCall nogil;
  return f();
}

}  // namespace ferry::python
