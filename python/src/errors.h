// ferry's std::error_code values as Python exceptions.
//
// The exception classes live in Python (ferry/_errors.py); at import it registers a factory
// here, and C++ calls it to build the exception for an error code. Only with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <system_error>

namespace ferry::python {

// (category, value, errc name or "", message, scope name): what Python needs to pick and build
// the exception. GIL held.
pybind11::tuple error_info(const std::error_code& ec);

// Raises the ferry.FerryError (subclass) for `ec`; `what` prefixes the message ("connect to
// 1.2.3.4:5"). GIL held.
[[noreturn]] void raise_error(const std::error_code& ec, const std::string& what = {});

}  // namespace ferry::python
