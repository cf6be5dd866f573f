#include "ferry/rdma/post_back.h"

#include <boost/asio/post.hpp>
#include <utility>

namespace ferry::rdma {
namespace {

// `fn` holding `link` until after `fn` itself is destroyed (a lambda's captures are destroyed in
// an unspecified order, a class's members in the reverse of theirs).
struct HeldCall {
  std::shared_ptr<PeerLink> link;  // declared first: destroyed last
  std::function<void()> fn;
  void operator()() { fn(); }
};

}  // namespace

void post_back(const std::shared_ptr<LoopGate>& gate, std::shared_ptr<PeerLink> link,
               std::function<void()> fn) {
  HeldCall call{std::move(link), std::move(fn)};
  const auto post = [&] {
    PeerStrand strand = call.link->strand();
    boost::asio::post(strand, std::move(call));
  };
  if (gate) {
    gate->while_open(post);
  } else {
    post();
  }
  // Refused: `fn` goes here, then the session (posted: both are empty already).
  call.fn = nullptr;
  call.link.reset();
}

}  // namespace ferry::rdma
