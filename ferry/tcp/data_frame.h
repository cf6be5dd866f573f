/// @file
/// The TCP data channel's chunk header. Bulk bytes follow it unframed, straight from the owner's
/// memory into the fetcher's target buffer.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace ferry::tcp {

static_assert(std::endian::native == std::endian::little,
              "the data channel header is written in host order, which must be little-endian");

inline constexpr uint32_t kDataMagic = 0x44595246;  ///< "FRYD": every DataHeader starts with it
inline constexpr uint32_t kFlagEnd = 1;             ///< last chunk of the request
/// On a last chunk: confirm receipt (the object counts its serves, PutOptions::on_served), with an
/// empty TransportMessage on the metadata channel, which outlives a broken data connection.
inline constexpr uint32_t kFlagAckWanted = 2;

/// The header of one chunk on a TCP data channel, in host (little-endian) byte order, followed by
/// `length` payload bytes for tensor `tensor` of request `request_id` at `offset`. The fetcher
/// refuses a chunk outside its target or overlapping bytes already written (Coverage).
struct DataHeader {
  uint32_t magic = kDataMagic;  ///< kDataMagic; anything else ends the channel (protocol error)
  uint32_t flags = 0;           ///< kFlagEnd, kFlagAckWanted
  uint64_t request_id = 0;      ///< the fetch it belongs to (the fetcher's request id)
  uint32_t tensor = 0;          ///< index of the tensor (and target) within the request
  uint32_t reserved = 0;        ///< zero; pads the header to 8-byte alignment
  uint64_t offset = 0;          ///< within the tensor
  uint64_t length = 0;          ///< payload bytes after this header
};
static_assert(sizeof(DataHeader) == 40);

}  // namespace ferry::tcp
