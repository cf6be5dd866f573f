// The manifest `ferry serve` writes and `ferry fetch` verifies against:
// {"server": "host:port", "checksum_algorithm": "xxh3-64", "objects": [{"ref": "ferry1:...",
//   "bytes": N, "tensors": [{"bytes": N, "checksum": "hex"}]}]}
// (checksums: cli/checksum.h; a manifest naming another algorithm, or none, is refused).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::cli {

struct ManifestTensor {
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

struct ManifestObject {
  std::string ref;   // text form, "ferry1:..."
  std::string name;  // a served file's name ("name"; optional): what fetch --out calls it
  uint64_t bytes = 0;
  std::vector<ManifestTensor> tensors;
};

struct Manifest {
  std::string server;
  std::vector<ManifestObject> objects;
};

// The manifest as a JSON document.
std::string manifest_to_json(const Manifest& manifest);

// Writes the manifest to `path` (replacing it). Returns false and sets `error` on failure.
bool write_manifest(const std::string& path, const Manifest& manifest, std::string& error);

// Reads and validates a manifest. Returns false and sets `error` (naming the offending field)
// when the file cannot be read or does not follow the schema; unknown fields are ignored.
bool read_manifest(const std::string& path, Manifest& manifest, std::string& error);

}  // namespace ferry::cli
