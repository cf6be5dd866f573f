// ferry._ferry: the native half of the ferry Python package (the Python half is ferry/).
#include <pybind11/pybind11.h>

#include "ferry/ferry.h"
#include "python/src/bindings.h"

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "ferry's native bindings; use the ferry package, not this module";
  m.attr("__version__") = ferry::kVersion;
  ferry::register_builtin_transports();
  ferry::python::bind_errors(m);
  ferry::python::bind_completions(m);
  ferry::python::bind_object_ref(m);
  ferry::python::bind_fetch(m);
  ferry::python::bind_context(m);
  ferry::python::bind_collective(m);
}
