// guarded() (ferry/net/core/guard.h): a handler runs on its owner's strand, is dropped once the
// owner closed, and a std::bad_alloc it throws goes to the owner's out_of_memory() instead of
// leaving the io loop.
#include "ferry/net/core/guard.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <new>

namespace ferry {
namespace {

struct Owner : std::enable_shared_from_this<Owner> {
  explicit Owner(boost::asio::io_context& io) : strand_(boost::asio::make_strand(io)) {}
  boost::asio::strand<boost::asio::io_context::executor_type>& strand() { return strand_; }
  std::shared_ptr<void> keep_alive() { return shared_from_this(); }
  bool closed() const { return closed_; }
  void out_of_memory() {
    ++out_of_memory_calls;
    closed_ = true;
  }

  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  bool closed_ = false;
  int out_of_memory_calls = 0;
};

TEST(Guarded, AHandlerRunsUntilItsOwnerClosed) {
  boost::asio::io_context io;
  auto owner = std::make_shared<Owner>(io);
  int runs = 0;
  boost::asio::post(guarded(*owner, [&] { ++runs; }));
  io.run();
  owner->closed_ = true;
  boost::asio::post(guarded(*owner, [&] { ++runs; }));
  io.restart();
  io.run();
  EXPECT_EQ(runs, 1);
}

TEST(Guarded, OutOfMemoryAfterTheHandlerClosedItsOwnerIsNotReported) {
  boost::asio::io_context io;
  auto owner = std::make_shared<Owner>(io);
  boost::asio::post(guarded(*owner, [&] {
    owner->closed_ = true;
    throw std::bad_alloc();
  }));
  EXPECT_NO_THROW(io.run());
  EXPECT_EQ(owner->out_of_memory_calls, 0);
}

TEST(Guarded, OutOfMemoryInAHandlerGoesToTheOwnerOnce) {
  boost::asio::io_context io;
  auto owner = std::make_shared<Owner>(io);
  int after = 0;
  boost::asio::post(guarded(*owner, [] { throw std::bad_alloc(); }));
  boost::asio::post(guarded(*owner, [&] { ++after; }));  // the owner has ended by then
  EXPECT_NO_THROW(io.run());
  EXPECT_EQ(owner->out_of_memory_calls, 1);
  EXPECT_EQ(after, 0);
}

}  // namespace
}  // namespace ferry
