// The one JSON layout the ferry tool writes (manifests, every --json document), for a
// boost::json::value built by the caller.
#pragma once

#include <string>

#include <boost/json/fwd.hpp>

namespace ferry::cli {

// `value` as JSON text for people to read: one member or item per line, indented by two spaces
// per level, `"key": value`, members in the object's (insertion) order, empty containers as {}
// and [], a newline after the last bracket. Strings are escaped by Boost.JSON; doubles have six
// significant digits, non-finite ones are written as null.
std::string pretty_json(const boost::json::value& value);

}  // namespace ferry::cli
