#include "cli/pretty_json.h"

#include <cmath>
#include <cstdio>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace ferry::cli {
namespace {

void newline(std::string& out, int depth) {
  out += '\n';
  out.append(2 * depth, ' ');
}

void write(std::string& out, const boost::json::value& v, int depth) {
  switch (v.kind()) {
    case boost::json::kind::object: {
      const auto& object = v.get_object();
      out += '{';
      for (auto it = object.begin(); it != object.end(); ++it) {
        if (it != object.begin()) out += ',';
        newline(out, depth + 1);
        out += boost::json::serialize(it->key());
        out += ": ";
        write(out, it->value(), depth + 1);
      }
      if (!object.empty()) newline(out, depth);
      out += '}';
      break;
    }
    case boost::json::kind::array: {
      const auto& array = v.get_array();
      out += '[';
      for (auto it = array.begin(); it != array.end(); ++it) {
        if (it != array.begin()) out += ',';
        newline(out, depth + 1);
        write(out, *it, depth + 1);
      }
      if (!array.empty()) newline(out, depth);
      out += ']';
      break;
    }
    case boost::json::kind::double_: {
      // Not Boost's serializer: Boost 1.81 writes doubles in ryu's shortest exponent form
      // (0.1234567 -> 1.234567E-1, 2.0 -> 2E0) and infinity as Infinity, which is not JSON.
      // Rates and latencies read better as printf's six significant digits.
      const double number = v.get_double();
      if (!std::isfinite(number)) {
        out += "null";
        break;
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", number);
      out += buf;
      break;
    }
    default:  // strings, integers, booleans, null
      out += boost::json::serialize(v);
  }
}

}  // namespace

std::string pretty_json(const boost::json::value& value) {
  std::string out;
  write(out, value, 0);
  out += '\n';
  return out;
}

}  // namespace ferry::cli
