// The pieces of the `ferry._ferry` extension module, one binder per file.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

void bind_errors(pybind11::module_& m);       // errors.cc
void bind_completions(pybind11::module_& m);  // completions.cc
void bind_object_ref(pybind11::module_& m);   // object_ref.cc
void bind_fetch(pybind11::module_& m);        // fetch.cc
void bind_context(pybind11::module_& m);      // context.cc

}  // namespace ferry::python
