#include "cli/manifest.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cli/checksum.h"
#include "cli/json.h"

namespace ferry::cli {
namespace {

bool set_error(std::string& error, std::string what) {
  error = std::move(what);
  return false;
}

bool parse_tensor(const JsonValue& v, ManifestTensor& out) {
  const JsonValue* bytes = v.find("bytes");
  const JsonValue* sum = v.find("checksum");
  if (!bytes || !bytes->as_uint64() || !sum || !sum->is_string()) return false;
  auto parsed = parse_checksum_hex(sum->text);
  if (!parsed) return false;
  out.bytes = *bytes->as_uint64();
  out.checksum = *parsed;
  return true;
}

bool parse_object(const JsonValue& v, ManifestObject& out, std::string& error) {
  const JsonValue* ref = v.find("ref");
  const JsonValue* bytes = v.find("bytes");
  const JsonValue* tensors = v.find("tensors");
  if (!ref || !ref->is_string()) return set_error(error, "missing \"ref\" string");
  if (!bytes || !bytes->as_uint64()) return set_error(error, "missing \"bytes\" number");
  if (!tensors || !tensors->is_array()) return set_error(error, "missing \"tensors\" array");
  out.ref = ref->text;
  if (const JsonValue* name = v.find("name"); name && name->is_string()) out.name = name->text;
  out.bytes = *bytes->as_uint64();
  for (size_t i = 0; i < tensors->items.size(); ++i) {
    if (!parse_tensor(tensors->items[i], out.tensors.emplace_back())) {
      return set_error(error,
                       "tensor " + std::to_string(i) + ": needs \"bytes\" and a hex \"checksum\"");
    }
  }
  return true;
}

}  // namespace

std::string manifest_to_json(const Manifest& manifest) {
  JsonWriter w;
  w.begin_object().key("server").value(manifest.server);
  w.key("checksum_algorithm").value(kChecksumAlgorithm).key("objects").begin_array();
  for (const auto& object : manifest.objects) {
    w.begin_object().key("ref").value(object.ref);
    if (!object.name.empty()) w.key("name").value(object.name);
    w.key("bytes").value(object.bytes);
    w.key("tensors").begin_array();
    for (const auto& t : object.tensors) {
      w.begin_object().key("bytes").value(t.bytes);
      w.key("checksum").value(checksum_hex(t.checksum)).end_object();
    }
    w.end_array().end_object();
  }
  w.end_array().end_object();
  return w.str();
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
  auto doc = parse_json(text.str(), error);
  if (!doc) return false;
  const JsonValue* server = doc->find("server");
  const JsonValue* objects = doc->find("objects");
  if (!server || !server->is_string()) return set_error(error, "missing \"server\" string");
  if (!objects || !objects->is_array()) return set_error(error, "missing \"objects\" array");
  const JsonValue* algorithm = doc->find("checksum_algorithm");
  if (!algorithm || !algorithm->is_string() || algorithm->text != kChecksumAlgorithm) {
    return set_error(error, std::string("checksums are not ") + kChecksumAlgorithm +
                                " (\"checksum_algorithm\"; a manifest from an older ferry: "
                                "make it again with ferry serve --manifest)");
  }
  manifest.server = server->text;
  manifest.objects.clear();
  for (size_t i = 0; i < objects->items.size(); ++i) {
    if (!parse_object(objects->items[i], manifest.objects.emplace_back(), error)) {
      return set_error(error, "object " + std::to_string(i) + ": " + error);
    }
  }
  return true;
}

}  // namespace ferry::cli
