#include "python/src/errors.h"

#include <string>
#include <string_view>

#include "ferry/net/errors.h"
#include "python/src/bindings.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

// The name Python shows for `ec` (ferry.Errc): errc_name() for ferry's category, else "".
std::string_view name_of(const std::error_code& ec) {
  if (ec.category() != ferry_category()) return "";
  const auto name = errc_name(static_cast<errc>(ec.value()));
  return name == "unknown" ? "" : name;
}

// errc values are below 128 (ferry/net/errors.h groups them by scope in steps of 20).
constexpr int kErrcLimit = 128;

py::object& factory() {
  // Leaked on purpose: a py::object destroyed at process exit would decref without Python.
  static auto* f = new py::object;
  return *f;
}

}  // namespace

py::tuple error_info(const std::error_code& ec) {
  return py::make_tuple(ec.category().name(), ec.value(), std::string(name_of(ec)), ec.message(),
                        std::string(scope_name(scope_of(ec))));
}

void raise_error(const std::error_code& ec, const std::string& what) {
  if (!factory()) throw std::system_error(ec, what);
  py::object exc = factory()(error_info(ec), what);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void bind_errors(py::module_& m) {
  m.def(
      "_set_error_factory", [](py::object f) { factory() = std::move(f); },
      "Registers f(info, what) -> exception, info as from _error_info.");
  m.def(
      "_errc_values",
      [] {
        py::dict d;
        for (int v = 0; v < kErrcLimit; ++v) {
          const auto name = errc_name(static_cast<errc>(v));
          if (name != "unknown") d[py::str(std::string(name))] = v;
        }
        return d;
      },
      "{errc name: value} of every ferry error code.");
  m.def(
      "_error_info",
      [](int value) { return error_info(make_error_code(static_cast<errc>(value))); },
      "(category, value, name, message, scope) of a ferry errc value: for tests.");
}

}  // namespace ferry::python
