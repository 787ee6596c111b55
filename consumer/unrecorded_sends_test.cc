// UnrecordedSends against a real store: what a correction sees (registered sends and
// recorded deliveries), the outbox-epoch check of a registration, and the lock that
// makes a correction's check and commit one step for a registering delivery.
#include "consumer/unrecorded_sends.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "consumer/testing/fakes.h"
#include "gtest/gtest.h"
#include "store/store.h"

namespace handoff::consumer {
namespace {

class UnrecordedSendsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::StoreOptions so;
    so.path = testing::TestDir("unrecorded-sends");
    std::filesystem::remove_all(so.path);
    absl::StatusOr<std::unique_ptr<store::Store>> s = store::Store::Open(so);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    store::CheckpointRecord ingest, delivery;
    ingest.set_resume_cursor("c0");
    ASSERT_TRUE(store_->ResetSource("s", ingest, delivery).ok());
    epoch_ = Delivery().outbox_epoch();
    sends_ = std::make_unique<UnrecordedSends>(store_.get(), "s");
  }

  store::CheckpointRecord Delivery() {
    absl::StatusOr<store::CheckpointRecord> d =
        store_->LoadCheckpoint("s", store::Stage::kDelivery);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : store::CheckpointRecord();
  }

  // An ingest correction's commit: deletes the outbox entry at `pos` (which fences the
  // delivery stage and moves its outbox epoch).
  void CommitCorrection(Position pos) {
    std::unique_ptr<store::StepBatch> step = store_->NewStep("s");
    step->DeleteOutbox(pos);
    store::Fence fence;
    fence.any_version = true;
    absl::StatusOr<store::CheckpointRecord> r =
        store_->CommitStep(store::Stage::kIngest, step.get(), fence, store::CheckpointUpdate{});
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // The first orphan the sink may have applied (nullopt: the correction committed).
  std::optional<Position> Correct(const std::vector<Position>& orphans, bool* committed) {
    *committed = false;
    absl::StatusOr<std::optional<Position>> r = sends_->CommitUnlessSent(orphans, [&] {
      CommitCorrection(orphans.front());
      *committed = true;
    });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::nullopt;
  }

  std::unique_ptr<store::Store> store_;
  std::unique_ptr<UnrecordedSends> sends_;
  uint64_t epoch_ = 0;
};

TEST_F(UnrecordedSendsTest, ACorrectionThatReplacesASentEventIsNotCommitted) {
  absl::StatusOr<bool> registered =
      sends_->RegisterIfCurrent(epoch_, {Position{100, 0}, Position{100, 1}});
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_TRUE(*registered);
  bool committed = false;
  std::optional<Position> sent = Correct({Position{99, 5}, Position{100, 1}}, &committed);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(*sent, (Position{100, 1}));
  EXPECT_FALSE(committed);
  EXPECT_EQ(Delivery().outbox_epoch(), epoch_);  // nothing fenced
  // Orphans beside the sent events commit.
  EXPECT_FALSE(Correct({Position{99, 5}, Position{101, 0}}, &committed).has_value());
  EXPECT_TRUE(committed);
}

TEST_F(UnrecordedSendsTest, ForgottenSendsNoLongerBlockACorrection) {
  ASSERT_TRUE(sends_->RegisterIfCurrent(epoch_, {Position{100, 0}, Position{100, 1}}).ok());
  sends_->Forget({Position{100, 0}, Position{100, 1}});
  EXPECT_EQ(sends_->size(), 0u);
  bool committed = false;
  EXPECT_FALSE(Correct({Position{100, 0}}, &committed).has_value());
  EXPECT_TRUE(committed);
}

TEST_F(UnrecordedSendsTest, ARecordedDeliveryBlocksACorrection) {
  std::unique_ptr<store::StepBatch> step = store_->NewStep("s");
  store::ReceiptRecord receipt;
  receipt.set_block_hash("0xa");
  step->PutReceipt(store::Stage::kDelivery, Position{100, 2}, receipt);
  store::Fence fence;
  fence.any_version = true;
  ASSERT_TRUE(store_->CommitStep(store::Stage::kDelivery, step.get(), fence,
                                 store::CheckpointUpdate{})
                  .ok());
  // And a later orphan is registered: the first one in order is reported.
  ASSERT_TRUE(sends_->RegisterIfCurrent(epoch_, {Position{100, 3}}).ok());
  bool committed = false;
  std::optional<Position> sent =
      Correct({Position{100, 1}, Position{100, 2}, Position{100, 3}}, &committed);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(*sent, (Position{100, 2}));
  EXPECT_FALSE(committed);
}

TEST_F(UnrecordedSendsTest, ASendReadBeforeACorrectionCommittedIsNotRegistered) {
  bool committed = false;
  EXPECT_FALSE(Correct({Position{100, 0}}, &committed).has_value());
  ASSERT_TRUE(committed);
  ASSERT_NE(Delivery().outbox_epoch(), epoch_);
  absl::StatusOr<bool> registered = sends_->RegisterIfCurrent(epoch_, {Position{100, 0}});
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_FALSE(*registered);
  EXPECT_EQ(sends_->size(), 0u);
  // Reread at the new epoch, it is.
  registered = sends_->RegisterIfCurrent(Delivery().outbox_epoch(), {Position{100, 0}});
  ASSERT_TRUE(registered.ok());
  EXPECT_TRUE(*registered);
}

// A registration that arrives while a correction is between its check and its commit
// waits for the commit, and then sees its fence.
TEST_F(UnrecordedSendsTest, ARegistrationWaitsForACorrectionInProgressAndSeesItsFence) {
  absl::Notification in_commit, registering, release;
  std::optional<absl::StatusOr<bool>> registered;
  std::thread delivery([&] {
    in_commit.WaitForNotification();
    registering.Notify();
    registered = sends_->RegisterIfCurrent(epoch_, {Position{100, 0}});
  });
  absl::StatusOr<std::optional<Position>> r =
      sends_->CommitUnlessSent({Position{100, 0}}, [&] {
        in_commit.Notify();
        registering.WaitForNotification();
        // The delivery thread is now at, or inside, RegisterIfCurrent: it cannot have
        // registered (the lock is held here), so the commit goes on.
        CommitCorrection(Position{100, 0});
      });
  delivery.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  ASSERT_TRUE(registered.has_value() && registered->ok());
  EXPECT_FALSE(**registered) << "a send read before the correction was registered after it";
}

}  // namespace
}  // namespace handoff::consumer
