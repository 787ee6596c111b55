// What the budget's lock costs the sources that hold slots while others wait for one.
//
// With more sources catching up than slots, most of them wait in Acquire, and every
// page that is fetched, parsed and committed takes the budget's lock a few times (its
// buffer lent and kept, its slot returned, a prefetch's TryAcquire). This measures one
// such lock round trip (a slot's buffer lent and given back) with `waiters` callers
// blocked in Acquire; its cost should not grow with them.
//
//   bazel run -c opt //consumer:page_budget_bench
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "consumer/page_budget.h"

namespace handoff::consumer {
namespace {

void BM_LockRoundTripWithWaiters(benchmark::State& state) {
  const int waiters = static_cast<int>(state.range(0));
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> held = budget->TryAcquire();
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < waiters; ++i) {
    threads.emplace_back([&] { budget->Acquire([&] { return done.load(); }); });
  }
  while (budget->waiting() != static_cast<size_t>(waiters)) std::this_thread::yield();
  for (auto _ : state) {
    held->buffer();        // lent by the budget, under its lock
    held->ReturnBuffer();  // and kept again
  }
  done.store(true);
  budget->WakeWaiters();
  held.reset();
  for (std::thread& t : threads) t.join();
  state.counters["waiters"] = waiters;
}
BENCHMARK(BM_LockRoundTripWithWaiters)->Arg(0)->Arg(8)->Arg(64)->Arg(1000);

}  // namespace
}  // namespace handoff::consumer

BENCHMARK_MAIN();
