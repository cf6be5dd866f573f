#include "rdma/verbs.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace ferry::rdma {
namespace {

class WcCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ibv_wc"; }
  std::string message(int ev) const override {
    return ibv_wc_status_str(static_cast<ibv_wc_status>(ev));
  }
};

}  // namespace

const std::error_category& wc_category() noexcept {
  static const WcCategory category;
  return category;
}

std::error_code last_errno() { return {errno ? errno : EIO, std::system_category()}; }

std::string gid_to_ip(const ibv_gid& gid) {
  static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(gid.raw, kMapped, sizeof(kMapped)) == 0) {
    inet_ntop(AF_INET, gid.raw + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  }
  return text;
}

}  // namespace ferry::rdma
