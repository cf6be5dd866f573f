#include "ferry/net/object_ref.h"

#include "ferry/net/errors.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/proto/wire_convert.h"

namespace ferry {
namespace {

constexpr std::string_view kTextPrefix = "ferry1:";
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string base64url_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kB64[(acc >> bits) & 0x3f]);
    }
  }
  if (bits > 0) out.push_back(kB64[(acc << (6 - bits)) & 0x3f]);
  return out;
}

bool base64url_decode(std::string_view in, std::string& out) {
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '-')
      v = 62;
    else if (c == '_')
      v = 63;
    else
      return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

}  // namespace

uint64_t TransportMetadata::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes;
  return n;
}

void to_wire(const TransportInfo& in, wire::TransportInfo& out) {
  out.set_name(in.name);
  for (const auto& d : in.devices) out.add_devices(d);
  out.set_locator(in.descriptor);
  out.set_priority(in.priority);
}

bool within_wire_limits(const google::protobuf::RepeatedPtrField<wire::TransportInfo>& transports) {
  if (transports.size() > kMaxWireTransports) return false;
  for (const auto& t : transports) {
    if (t.devices_size() > kMaxWireDevices) return false;
  }
  return true;
}

TransportInfo from_wire(const wire::TransportInfo& in) {
  TransportInfo out;
  out.name = in.name();
  out.devices.assign(in.devices().begin(), in.devices().end());
  out.descriptor = in.locator();
  out.priority = in.priority();
  return out;
}

void to_wire(const ObjectRef& in, wire::ObjectRef& out) {
  out.set_owner(in.owner);
  out.set_object_id(in.object_id);
  out.set_owner_instance(in.owner_instance);
  out.set_name(in.name);
  auto* md = out.mutable_metadata();
  md->set_transport(in.metadata.transport);
  md->set_extension(in.metadata.extension);
  md->set_exclusive(in.metadata.exclusive);
  for (const auto& t : in.metadata.tensors) {
    auto* w = md->add_tensors();
    for (int64_t d : t.shape) w->add_shape(d);
    w->set_dtype(static_cast<uint32_t>(t.dtype));
    w->set_device(t.device);
    w->set_nbytes(t.nbytes);
    if (t.checksum) w->set_crc32c(*t.checksum);
  }
}

bool from_wire(const wire::ObjectRef& in, ObjectRef& out) {
  out.owner = in.owner();
  out.object_id = in.object_id();
  out.owner_instance = in.owner_instance();
  out.name = in.name();
  out.metadata.transport = in.metadata().transport();
  out.metadata.extension = in.metadata().extension();
  out.metadata.exclusive = in.metadata().exclusive();
  out.metadata.tensors.clear();
  uint64_t total = 0;
  for (const auto& w : in.metadata().tensors()) {
    TensorMeta t;
    t.shape.assign(w.shape().begin(), w.shape().end());
    if (w.dtype() > static_cast<uint32_t>(DType::kBool)) return false;
    t.dtype = static_cast<DType>(w.dtype());
    t.device = w.device();
    t.nbytes = w.nbytes();
    if (w.has_crc32c()) t.checksum = w.crc32c();
    if (t.nbytes > (uint64_t{1} << 48) || total + t.nbytes < total) return false;
    total += t.nbytes;
    out.metadata.tensors.push_back(std::move(t));
  }
  return out.object_id != 0 || !out.name.empty();
}

ObjectRef ObjectRef::named(std::string owner, std::string name, std::vector<TensorMeta> tensors) {
  ObjectRef ref;
  ref.owner = std::move(owner);
  ref.name = std::move(name);
  ref.metadata.tensors = std::move(tensors);
  return ref;
}

std::string ObjectRef::serialize() const {
  wire::ObjectRef w;
  to_wire(*this, w);
  return w.SerializeAsString();
}

Result<ObjectRef> ObjectRef::parse(std::string_view bytes) {
  wire::ObjectRef w;
  if (!w.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return errc::invalid_argument;
  ObjectRef ref;
  if (!from_wire(w, ref)) return errc::invalid_argument;
  return ref;
}

std::string ObjectRef::to_string() const {
  return std::string(kTextPrefix) + base64url_encode(serialize());
}

Result<ObjectRef> ObjectRef::from_string(std::string_view text) {
  if (text.substr(0, kTextPrefix.size()) != kTextPrefix) return errc::invalid_argument;
  std::string bytes;
  if (!base64url_decode(text.substr(kTextPrefix.size()), bytes)) return errc::invalid_argument;
  return parse(bytes);
}

}  // namespace ferry
