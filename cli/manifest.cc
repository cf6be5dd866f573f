#include "cli/manifest.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/stream_parser.hpp>
#include <boost/json/value.hpp>

#include "cli/checksum.h"
#include "cli/pretty_json.h"

namespace ferry::cli {
namespace {

bool set_error(std::string& error, std::string what) {
  error = std::move(what);
  return false;
}

// A JSON number as a byte count: a non-negative integer written without fraction or exponent
// (Boost.JSON keeps those as int64, or uint64 above INT64_MAX, so all 64 bits survive).
std::optional<uint64_t> as_uint64(const boost::json::value* v) {
  if (v && v->is_uint64()) return v->get_uint64();
  if (v && v->is_int64() && v->get_int64() >= 0) return static_cast<uint64_t>(v->get_int64());
  return std::nullopt;
}

// The member `key` of `v`; nullptr when absent, or when `v` is not an object.
const boost::json::value* member(const boost::json::value& v, std::string_view key) {
  const boost::json::object* o = v.if_object();
  return o ? o->if_contains(key) : nullptr;
}
const boost::json::string* string_member(const boost::json::value& v, std::string_view key) {
  const boost::json::value* m = member(v, key);
  return m ? m->if_string() : nullptr;
}
const boost::json::array* array_member(const boost::json::value& v, std::string_view key) {
  const boost::json::value* m = member(v, key);
  return m ? m->if_array() : nullptr;
}

bool parse_tensor(const boost::json::value& v, ManifestTensor& out) {
  auto bytes = as_uint64(member(v, "bytes"));
  const boost::json::string* sum = string_member(v, "checksum");
  if (!bytes || !sum) return false;
  auto parsed = parse_checksum_hex(*sum);
  if (!parsed) return false;
  out.bytes = *bytes;
  out.checksum = *parsed;
  return true;
}

bool parse_object(const boost::json::value& v, ManifestObject& out, std::string& error) {
  const boost::json::string* ref = string_member(v, "ref");
  auto bytes = as_uint64(member(v, "bytes"));
  const boost::json::array* tensors = array_member(v, "tensors");
  if (!ref) return set_error(error, "missing \"ref\" string");
  if (!bytes) return set_error(error, "missing \"bytes\" number");
  if (!tensors) return set_error(error, "missing \"tensors\" array");
  out.ref = *ref;
  if (const boost::json::string* name = string_member(v, "name")) out.name = *name;
  out.bytes = *bytes;
  for (size_t i = 0; i < tensors->size(); ++i) {
    if (!parse_tensor((*tensors)[i], out.tensors.emplace_back())) {
      return set_error(error,
                       "tensor " + std::to_string(i) + ": needs \"bytes\" and a hex \"checksum\"");
    }
  }
  return true;
}

// Parses a whole document. The stream parser (not boost::json::parse) because it says how far
// it got: errors read "<Boost's message> at offset N".
std::optional<boost::json::value> parse_document(std::string_view text, std::string& error) {
  boost::json::parse_options options;
  options.max_depth = 64;
  // File names ("name") are bytes, and ferry serve writes them as they are: take them back.
  options.allow_invalid_utf8 = true;
  boost::json::stream_parser parser({}, options);
  boost::system::error_code ec;
  const size_t consumed = parser.write(text.data(), text.size(), ec);
  if (!ec) parser.finish(ec);
  if (ec) {
    error = ec.message() + " at offset " + std::to_string(consumed);
    return std::nullopt;
  }
  return parser.release();
}

}  // namespace

std::string manifest_to_json(const Manifest& manifest) {
  boost::json::array objects;
  for (const auto& object : manifest.objects) {
    boost::json::array tensors;
    for (const auto& t : object.tensors) {
      tensors.push_back(
          boost::json::object{{"bytes", t.bytes}, {"checksum", checksum_hex(t.checksum)}});
    }
    boost::json::object o{{"ref", object.ref}};
    if (!object.name.empty()) o["name"] = object.name;
    o["bytes"] = object.bytes;
    o["tensors"] = std::move(tensors);
    objects.push_back(std::move(o));
  }
  return pretty_json(boost::json::object{{"server", manifest.server},
                                         {"checksum_algorithm", kChecksumAlgorithm},
                                         {"objects", std::move(objects)}});
}

bool write_manifest(const std::string& path, const Manifest& manifest, std::string& error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << manifest_to_json(manifest);
  out.close();
  return out ? true : set_error(error, std::strerror(errno));
}

bool read_manifest(const std::string& path, Manifest& manifest, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return set_error(error, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  auto doc = parse_document(text.str(), error);
  if (!doc) return false;
  const boost::json::string* server = string_member(*doc, "server");
  const boost::json::array* objects = array_member(*doc, "objects");
  if (!server) return set_error(error, "missing \"server\" string");
  if (!objects) return set_error(error, "missing \"objects\" array");
  const boost::json::string* algorithm = string_member(*doc, "checksum_algorithm");
  if (!algorithm || *algorithm != kChecksumAlgorithm) {
    return set_error(error, std::string("checksums are not ") + kChecksumAlgorithm +
                                " (\"checksum_algorithm\"; a manifest from an older ferry: "
                                "make it again with ferry serve --manifest)");
  }
  manifest.server = *server;
  manifest.objects.clear();
  for (size_t i = 0; i < objects->size(); ++i) {
    if (!parse_object((*objects)[i], manifest.objects.emplace_back(), error)) {
      return set_error(error, "object " + std::to_string(i) + ": " + error);
    }
  }
  return true;
}

}  // namespace ferry::cli
