// `_ferry.CRef`: the C++ ObjectRef, as ferry/_ref.py wraps it (ferry.ObjectRef adds the Python
// description of each tensor).
#include <pybind11/stl.h>

#include "ferry/net/errors.h"
#include "ferry/net/object_ref.h"
#include "python/src/bindings.h"
#include "python/src/errors.h"

namespace py = pybind11;

namespace ferry::python {

void bind_object_ref(py::module_& m) {
  py::class_<ObjectRef>(m, "CRef", "ferry::ObjectRef")
      .def_readonly("owner", &ObjectRef::owner)
      .def_readonly("object_id", &ObjectRef::object_id)
      .def_readonly("owner_instance", &ObjectRef::owner_instance)
      .def_readonly("name", &ObjectRef::name)
      .def_property_readonly("transport", [](const ObjectRef& r) { return r.metadata.transport; })
      .def_property_readonly("exclusive", [](const ObjectRef& r) { return r.metadata.exclusive; })
      .def_property_readonly("nbytes", [](const ObjectRef& r) { return r.metadata.total_bytes(); })
      .def_property_readonly(
          "tensors",
          [](const ObjectRef& r) {
            py::list out;
            for (const auto& t : r.metadata.tensors) {
              out.append(py::make_tuple(py::tuple(py::cast(t.shape)),
                                        std::string(dtype_name(t.dtype)), t.device, t.nbytes));
            }
            return out;
          },
          "[(shape, dtype name, device, nbytes)] as ferry describes each tensor")
      .def("serialize", [](const ObjectRef& r) { return py::bytes(r.serialize()); })
      .def_static(
          "parse",
          [](std::string_view bytes) {
            auto ref = ObjectRef::parse(bytes);
            if (!ref) raise_error(ref.error(), "ObjectRef.from_bytes");
            return *std::move(ref);
          },
          "Inverse of serialize(); ferry.InvalidArgumentError for anything else.")
      .def("to_string", &ObjectRef::to_string)
      .def_static("from_string",
                  [](std::string_view text) {
                    auto ref = ObjectRef::from_string(text);
                    if (!ref) raise_error(ref.error(), "ObjectRef.from_string");
                    return *std::move(ref);
                  })
      .def("__eq__", [](const ObjectRef& a, const ObjectRef& b) { return a == b; });
}

}  // namespace ferry::python
