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

// An object's members or an array's elements between `open` and `close`, each on a line of its
// own at depth + 1 (write_item writes one) and comma-separated, `close` on a line at `depth`; an
// empty one as `open` and `close` alone.
template <typename Items, typename WriteItem>
void write_items(std::string& out, const Items& items, char open, char close, int depth,
                 WriteItem write_item) {
  out += open;
  for (auto it = items.begin(); it != items.end(); ++it) {
    if (it != items.begin()) out += ',';
    newline(out, depth + 1);
    write_item(*it);
  }
  if (!items.empty()) newline(out, depth);
  out += close;
}

void write(std::string& out, const boost::json::value& v, int depth) {
  switch (v.kind()) {
    case boost::json::kind::object:
      write_items(out, v.get_object(), '{', '}', depth, [&](const boost::json::key_value_pair& kv) {
        out += boost::json::serialize(kv.key());
        out += ": ";
        write(out, kv.value(), depth + 1);
      });
      break;
    case boost::json::kind::array:
      write_items(out, v.get_array(), '[', ']', depth,
                  [&](const boost::json::value& item) { write(out, item, depth + 1); });
      break;
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
