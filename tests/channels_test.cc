// Channels over a fake peer link and fake transports: one open per transport however many
// wait, the accepting side's refusal, install, drop and close. No sockets.
#include "ferry/net/session/channels.h"

#include <gtest/gtest.h>

#include "fake_session_link.h"

namespace ferry {
namespace {

using fakes::FakeChannel;
using fakes::FakeSessionLink;
using fakes::FakeTransport;

struct ChannelsTest : ::testing::Test {
  ChannelsTest() { transport->hold_opens = true; }

  // Ensures the transport's channel, recording the outcome in `outcomes`.
  void ensure() {
    channels.ensure(transport, [this](std::error_code ec) { outcomes.push_back(ec); });
  }

  FakeSessionLink peer;  // the side that connected
  Channels channels{peer};
  std::shared_ptr<FakeTransport> transport = std::make_shared<FakeTransport>("T", false);
  std::vector<std::error_code> outcomes;
};

TEST_F(ChannelsTest, WaitersShareOneOpenAndAnInstalledChannelIsReadyAtOnce) {
  ensure();
  ensure();
  EXPECT_EQ(transport->opens, 1);
  EXPECT_TRUE(outcomes.empty());
  EXPECT_EQ(channels.find("T"), nullptr);  // not while opening
  auto ch = std::make_shared<FakeChannel>();
  transport->pending_opens[0]({}, ch);
  EXPECT_EQ(outcomes, (std::vector<std::error_code>{{}, {}}));
  EXPECT_EQ(channels.find("T"), ch);
  ensure();  // inline now
  EXPECT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(transport->opens, 1);
}

TEST_F(ChannelsTest, AFailedOpenFailsItsWaitersAndTheNextEnsureOpensAgain) {
  ensure();
  ensure();
  transport->pending_opens[0](errc::connection_failed, nullptr);
  EXPECT_EQ(outcomes,
            (std::vector<std::error_code>{errc::connection_failed, errc::connection_failed}));
  EXPECT_EQ(channels.find("T"), nullptr);
  ensure();
  EXPECT_EQ(transport->opens, 2);
}

// An open that throws (out of memory in the transport) leaves nothing behind: ensure() throws,
// and the next one opens again instead of waiting behind an open that never started.
TEST_F(ChannelsTest, AnOpenThatThrowsIsForgottenAndTheNextEnsureOpensAgain) {
  transport->open_throws = true;
  EXPECT_THROW(ensure(), std::bad_alloc);
  EXPECT_TRUE(outcomes.empty());
  ensure();
  EXPECT_EQ(transport->opens, 2);
  ASSERT_EQ(transport->pending_opens.size(), 1u);
  transport->pending_opens[0]({}, std::make_shared<FakeChannel>());
  EXPECT_EQ(outcomes, (std::vector<std::error_code>{{}}));
}

TEST_F(ChannelsTest, TheAcceptingSideOpensNone) {
  FakeSessionLink acceptor(false);
  Channels theirs(acceptor);
  std::optional<std::error_code> outcome;
  theirs.ensure(transport, [&](std::error_code ec) { outcome = ec; });
  EXPECT_EQ(outcome, std::error_code(errc::transport_unavailable));
  EXPECT_EQ(transport->opens, 0);
}

TEST_F(ChannelsTest, AnInstallRunsTheWaitersAndReplacesNothing) {
  ensure();
  auto first = std::make_shared<FakeChannel>();
  EXPECT_TRUE(channels.install("T", first));
  EXPECT_EQ(outcomes, (std::vector<std::error_code>{{}}));
  EXPECT_FALSE(channels.install("T", std::make_shared<FakeChannel>()));
  EXPECT_EQ(channels.find("T"), first);
}

TEST_F(ChannelsTest, ADroppedChannelIsClosedAndForgotten) {
  auto ch = std::make_shared<FakeChannel>();
  ASSERT_TRUE(channels.install("T", ch));
  channels.drop("U", errc::device_error);  // none: nothing happens
  channels.drop("T", errc::device_error);
  EXPECT_TRUE(ch->closed);
  EXPECT_EQ(channels.find("T"), nullptr);
  ensure();  // the next fetch opens a new one
  EXPECT_EQ(transport->opens, 1);
}

TEST_F(ChannelsTest, CloseEndsEveryChannelAndWaiterAndAChannelThatOpensLater) {
  auto installed = std::make_shared<FakeChannel>();
  ASSERT_TRUE(channels.install("U", installed));
  ensure();
  channels.close(errc::peer_closed);
  EXPECT_TRUE(installed->closed);
  EXPECT_EQ(outcomes, (std::vector<std::error_code>{errc::peer_closed}));
  EXPECT_EQ(channels.find("U"), nullptr);

  auto late = std::make_shared<FakeChannel>();
  transport->pending_opens[0]({}, late);
  EXPECT_TRUE(late->closed);
  EXPECT_EQ(channels.find("T"), nullptr);
  EXPECT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(channels.install("T", std::make_shared<FakeChannel>()));
}

}  // namespace
}  // namespace ferry
