// The pieces of the `ferry._ferry` extension module, one binder per file.
#pragma once

#include <pybind11/pybind11.h>

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

}  // namespace ferry::python
