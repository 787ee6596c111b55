#include "consumer/provider.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

// Records which call reached it, and with which cursor.
class CallLog : public Provider {
 public:
  explicit CallLog(std::vector<std::string>* calls) : calls_(calls) {}
  FetchResult Fetch(const std::string& cursor) override {
    calls_->push_back("Fetch " + cursor);
    FetchResult r;
    r.refusal = Refusal{};
    r.refusal->message = "from the inner provider";
    return r;
  }
  bool Ready(const std::string& cursor) override {
    calls_->push_back("Ready " + cursor);
    return true;
  }
  void Cancel() override { calls_->push_back("Cancel"); }
  void Close() override { calls_->push_back("Close"); }
  void DropReadAhead() override { calls_->push_back("DropReadAhead"); }
  bool PolledPerFetch() const override {
    calls_->push_back("PolledPerFetch");
    return true;
  }

 private:
  std::vector<std::string>* const calls_;
};

// Watches Fetch only, as the benchmark's and the provider rig's decorators do.
class FetchCounter : public ProviderDecorator {
 public:
  using ProviderDecorator::ProviderDecorator;
  FetchResult Fetch(const std::string& cursor) override {
    ++fetches;
    return inner().Fetch(cursor);
  }
  int fetches = 0;
};

TEST(ProviderDecoratorTest, ForwardsEveryCallItDoesNotOverride) {
  std::vector<std::string> calls;
  FetchCounter decorated(std::make_unique<CallLog>(&calls));
  const FetchResult r = decorated.Fetch("c1");
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->message, "from the inner provider");
  EXPECT_EQ(decorated.fetches, 1);
  EXPECT_TRUE(decorated.Ready("c2"));
  decorated.Cancel();
  decorated.Close();
  decorated.DropReadAhead();
  EXPECT_TRUE(decorated.PolledPerFetch());
  EXPECT_EQ(calls, (std::vector<std::string>{"Fetch c1", "Ready c2", "Cancel", "Close",
                                             "DropReadAhead", "PolledPerFetch"}));
}

}  // namespace
}  // namespace handoff::consumer
