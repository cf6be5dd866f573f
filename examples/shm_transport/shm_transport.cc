#include "shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace shm_example {
namespace {

using ferry::errc;
using ferry::make_error_code;

constexpr const char* kPrefix = "ferry-shm-";

std::string read_host_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return id + "@" + host;
}

uint64_t aligned(uint64_t n) { return (n + 63) & ~uint64_t{63}; }

}  // namespace

// ---------------------------------------------------------------- segments

Segments::~Segments() {
  std::lock_guard lock(mu_);
  for (const auto& [id, name] : names_) shm_unlink(name.c_str());
}

std::string Segments::ensure(const ferry::StoredObject& object, std::error_code& ec) {
  std::lock_guard lock(mu_);
  if (auto it = names_.find(object.id); it != names_.end()) return it->second;
  static const uint64_t token = std::random_device{}();
  const std::string name = "/" + std::string(kPrefix) + std::to_string(getpid()) + "-" +
                           std::to_string(token % 1000000) + "-" + std::to_string(object.id);
  uint64_t size = 0;
  for (const auto& t : object.tensors) size = aligned(size) + t.data.size();
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    ec = std::error_code(errno, std::system_category());
    return {};
  }
  void* base = ftruncate(fd, static_cast<off_t>(size ? size : 1)) == 0
                   ? mmap(nullptr, size ? size : 1, PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) {
    ec = std::error_code(errno, std::system_category());
    shm_unlink(name.c_str());
    return {};
  }
  uint64_t off = 0;
  for (const auto& t : object.tensors) {
    off = aligned(off);
    if (!t.data.empty())
      std::memcpy(static_cast<std::byte*>(base) + off, t.data.data(), t.data.size());
    off += t.data.size();
  }
  munmap(base, size ? size : 1);
  names_[object.id] = name;
  return name;
}

void Segments::remove(ferry::ObjectId object) {
  std::lock_guard lock(mu_);
  auto it = names_.find(object);
  if (it == names_.end()) return;  // never granted over SHM
  shm_unlink(it->second.c_str());  // mappings that fetchers hold stay valid
  names_.erase(it);
}

size_t Segments::size() const {
  std::lock_guard lock(mu_);
  return names_.size();
}

// ---------------------------------------------------------------- options

// [environment]
ShmOptions ShmOptions::from_environment() {
  ShmOptions o;
  if (const char* v = std::getenv("SHM_COPY_STEP"); v && *v) {
    o.copy_step = std::strtoull(v, nullptr, 10);
  }
  return o;
}
// [environment]

// ---------------------------------------------------------------- identity and negotiation

// [options-kept]
ShmTransport::ShmTransport(const ferry::TransportEnv& env, const ShmOptions& options)
    : host_id_(read_host_id()),
      open_timeout_(env.options.handshake_timeout),
      copy_step_(options.copy_step ? options.copy_step : ShmOptions{}.copy_step) {
  remove_orphaned_segments();
}
// [options-kept]

ferry::TransportInfo ShmTransport::local_info() const {
  return ferry::TransportInfo{kName, {"cpu"}, host_id_, 50};  // RDMA 100 > SHM 50 > TCP 10
}

bool ShmTransport::peer_has_transport(const ferry::PeerInfo& peer) const {
  const ferry::TransportInfo* theirs = peer.find_transport(kName);
  return theirs && theirs->descriptor == host_id_;  // same boot of the same host
}

// [open]
void ShmTransport::async_open_channel(std::shared_ptr<ferry::PeerLink> link,
                                      ferry::ChannelOpenHandler done) {
  auto timer = std::make_shared<boost::asio::steady_timer>(link->strand().get_inner_executor(),
                                                           open_timeout_);
  {
    std::lock_guard lock(mu_);
    opening_[link.get()] = Opening{std::move(done), timer};
  }
  timer->async_wait(boost::asio::bind_executor(
      link->strand(), [this, weak = std::weak_ptr(link)](boost::system::error_code ec) {
        auto l = weak.lock();
        if (ec || !l) return;
        ferry::ChannelOpenHandler pending;
        {
          std::lock_guard lock(mu_);
          auto it = opening_.find(l.get());
          if (it == opening_.end()) return;  // answered in time
          pending = std::move(it->second.done);
          opening_.erase(it);
        }
        pending(make_error_code(errc::handshake_failed), nullptr);
      }));
  link->send_transport_message(kName, 0, "hello " + host_id_);
}

// Until a channel is installed, the peer's messages come here: "hello" on the accepting side,
// "welcome" or "refuse" on the side that opens.
void ShmTransport::on_transport_message(ferry::PeerLink& link, uint64_t, std::string_view payload) {
  std::istringstream in{std::string(payload)};
  std::string verb;
  in >> verb;
  if (verb == "hello") {  // acceptor: build our side of the channel
    std::string their_host;
    in >> their_host;
    if (their_host != host_id_) {
      return link.send_transport_message(kName, 0, "refuse not-the-same-host");
    }
    link.install_channel(kName,
                         std::make_shared<ShmChannel>(link.shared_link(), segments_, copy_step_));
    return link.send_transport_message(kName, 0, "welcome");
  }
  if (verb != "welcome" && verb != "refuse") return;  // for a channel that is gone
  ferry::ChannelOpenHandler done;                     // initiator: the answer to our hello
  {
    std::lock_guard lock(mu_);
    auto it = opening_.find(&link);
    if (it == opening_.end()) return;
    done = std::move(it->second.done);
    it->second.timer->cancel();
    opening_.erase(it);
  }
  if (verb == "refuse") return done(make_error_code(errc::transport_unavailable), nullptr);
  done({}, std::make_shared<ShmChannel>(link.shared_link(), segments_, copy_step_));
}
// [open]

// [gc]
void ShmTransport::garbage_collect(const ferry::StoredObject& object) {
  segments_->remove(object.id);  // fetchers that mapped it keep valid memory
}
// [gc]

// ---------------------------------------------------------------- the channel

void ShmChannel::send(uint64_t request_id, const std::string& message) {
  if (auto link = link_.lock()) link->send_transport_message(kName, request_id, message);
}

bool ShmChannel::on_message(uint64_t rid, std::string_view payload) {
  std::istringstream in{std::string(payload)};
  std::string verb;
  in >> verb;
  if (verb == "grant") {
    on_grant(rid, in);
    return true;
  }
  if (verb != "release") return false;  // "hello" and its answers: the transport's
  auto it = leases_.find(rid);          // owner: the fetcher is done with the segment
  if (it == leases_.end()) return true;
  auto done = std::move(it->second.second);
  leases_.erase(it);  // unpins the object
  done({});
  return true;
}

// [send]
void ShmChannel::send_multiple(uint64_t rid, ferry::ObjectStore::Pin object, ferry::SendDone done) {
  std::error_code ec;
  const std::string name = segments_->ensure(object.object(), ec);
  if (ec) return done(make_error_code(errc::device_error));
  std::ostringstream grant;
  uint64_t off = 0;
  std::ostringstream offsets;
  for (const auto& t : object.object().tensors) {
    off = aligned(off);
    offsets << ' ' << off;
    off += t.data.size();
  }
  grant << "grant " << name << ' ' << (off ? off : 1) << ' ' << object.object().tensors.size()
        << offsets.str();
  leases_[rid] = {std::move(object), std::move(done)};  // pinned until "release"
  send(rid, grant.str());
}
// [send]

// [fetch]
ferry::Result<ferry::FetchRequest> ShmChannel::fetch_multiple(const ferry::FetchOp& op) {
  waiting_[op.request_id] = op;  // the owner's grant starts the copy
  return op.request;
}
// [fetch]

// [grant]
// Fetcher: "grant <segment> <size> <n> <offset>..." for a fetch we are waiting on.
void ShmChannel::on_grant(uint64_t rid, std::istream& in) {
  auto link = link_.lock();
  auto w = waiting_.find(rid);
  if (!link || w == waiting_.end()) return send(rid, "release");  // aborted meanwhile
  Copy c;
  c.op = std::move(w->second);
  waiting_.erase(w);
  std::string name;
  uint64_t size = 0;
  size_t n = 0;
  in >> name >> size >> n;
  bool ok = in && n == c.op.targets.size();  // before sizing anything by the peer's count
  c.offsets.resize(ok ? n : 0);
  for (auto& off : c.offsets) in >> off;
  ok = ok && in;
  for (size_t i = 0; ok && i < n; ++i) {
    ok = c.offsets[i] <= size && c.op.targets[i].size() <= size - c.offsets[i];
  }
  const int fd = ok ? shm_open(name.c_str(), O_RDONLY, 0) : -1;
  void* base = fd >= 0 ? mmap(nullptr, size ? size : 1, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) ::close(fd);  // the mapping stays valid
  if (base == MAP_FAILED) {
    send(rid, "release");  // end the owner's lease: we will not read
    return link->complete_fetch(
        rid, make_error_code(ok ? errc::object_not_found : errc::protocol_error));
  }
  c.base = static_cast<const std::byte*>(base);
  c.mapped = size ? size : 1;
  copying_.emplace(rid, std::move(c));
  copy_step(rid);
}

// Copies the next step of `rid` and posts the rest; completes the fetch at the end.
void ShmChannel::copy_step(uint64_t rid) {
  auto it = copying_.find(rid);
  if (it == copying_.end()) return;  // aborted meanwhile
  auto& c = it->second;
  size_t budget = copy_step_;
  while (c.tensor < c.op.targets.size() && budget > 0) {
    auto target = c.op.targets[c.tensor];
    const size_t n = std::min<size_t>(budget, target.size() - c.done);
    std::memcpy(target.data() + c.done, c.base + c.offsets[c.tensor] + c.done, n);
    c.done += n;
    budget -= n;
    if (c.done == target.size()) {
      ++c.tensor;
      c.done = 0;
    }
  }
  auto link = link_.lock();
  if (!link) return;
  if (c.tensor < c.op.targets.size()) {
    boost::asio::post(link->strand(), [self = shared_from_this(), rid] { self->copy_step(rid); });
    return;
  }
  munmap(const_cast<std::byte*>(c.base), c.mapped);
  copying_.erase(it);
  send(rid, "release");
  link->complete_fetch(rid, {});
}
// [grant]

// [abort]
bool ShmChannel::abort(uint64_t rid) {
  waiting_.erase(rid);
  if (auto c = copying_.find(rid); c != copying_.end()) {
    // Copies run in steps on this strand, so none is running now: stopping is immediate.
    munmap(const_cast<std::byte*>(c->second.base), c->second.mapped);
    copying_.erase(c);
    send(rid, "release");
  }
  if (auto l = leases_.find(rid); l != leases_.end()) {  // owner side: the peer gave up
    auto done = std::move(l->second.second);
    leases_.erase(l);
    done(make_error_code(errc::aborted));
  }
  return true;  // nothing of ours touches the request's buffers any more
}
// [abort]

// [close]
void ShmChannel::close(std::error_code ec) {
  for (auto& [id, c] : copying_) munmap(const_cast<std::byte*>(c.base), c.mapped);
  copying_.clear();
  waiting_.clear();
  auto ending = std::move(leases_);
  leases_.clear();
  for (auto& [id, lease] : ending) lease.second(ec);
  // An owner that died cannot unlink its segments; the survivors do.
  if (ec) remove_orphaned_segments();
}
// [close]

// [register]
bool register_shm_transport() {
  static const bool registered = [] {
    // With its options type: the factory gets the context's ShmOptions (or the defaults), and
    // ContextOptions::from_environment() asks ShmOptions::from_environment for them.
    auto ec = ferry::register_transport<ShmOptions>(
        kName, {"cpu"},
        [](const ferry::TransportEnv& env,
           const ShmOptions& options) -> ferry::Result<std::shared_ptr<ferry::TransportManager>> {
          return std::shared_ptr<ferry::TransportManager>(
              std::make_shared<ShmTransport>(env, options));
        },
        &ShmOptions::from_environment);
    return !ec || ec == errc::transport_duplicate;
  }();
  return registered;
}
// [register]

size_t remove_orphaned_segments() {
  size_t removed = 0;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoll(name.c_str() + std::strlen(kPrefix)));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH && shm_unlink(("/" + name).c_str()) == 0) {
      ++removed;
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace shm_example
