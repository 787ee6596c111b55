// CPU of one caught-up poll: HttpProvider::Fetch of the tip cursor against the provider
// simulator on loopback, which answers an empty page. Measured as the polling thread's
// own CPU time (CLOCK_THREAD_CPUTIME_ID), so the in-process simulator is not counted.
// This is the per-poll cost behind scenario 7 (1000 idle polling sources). Also timed:
// the same polls spaced out (one every 20 ms, as 1000 sources polling every 15-30 s
// are without coalescing) and in bursts (11 every 250 ms, as the idle backoff's 250 ms
// coalescing grid gathers them): what a poll costs depends mostly on whether the
// machine was awake.
//   bazel run -c opt //consumer/provider:idle_poll_bench
#include <semaphore.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <atomic>
#include <thread>
#include <vector>
#include <string>

#include "absl/time/clock.h"
#include "consumer/provider/curl_session.h"
#include "consumer/provider/http_provider.h"
#include "sim/provider_sim.h"

namespace handoff::consumer {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int Main(int argc, char** argv) {
  const int providers = argc > 1 ? std::atoi(argv[1]) : 1;
  sim::ProviderSimOptions sim_options;
  sim_options.chain.initial_head = 100;
  sim_options.threads = providers + 16;  // a kept-alive connection holds a server thread
  sim::ProviderSim sim(sim_options);
  if (!sim.Start(0).ok()) return 1;
  HttpProviderOptions options;
  options.base_url = sim.base_url();
  options.chain = "sim";
  options.source = "s";
  options.filter = "f";
  // As in handoffd: every provider's polls lease sessions from one pool.
  options.session_pool = std::make_shared<CurlSessionPool>(16);
  std::vector<std::unique_ptr<HttpProvider>> all;
  std::string cursor = "latest";
  for (int p = 0; p < providers; ++p) {
    absl::StatusOr<std::unique_ptr<HttpProvider>> provider = HttpProvider::Create(options);
    if (!provider.ok()) return 1;
    all.push_back(*std::move(provider));
  }
  for (int i = 0; i < 100; ++i) {  // follow `next` to the tip
    FetchResult r = all[0]->Fetch(cursor);
    if (!r.page.has_value()) return 1;
    if (r.page->NothingNewAfter(cursor)) break;
    cursor = r.page->next;
  }
  const int kPolls = std::max(5000, 2 * providers);
  const double cpu0 = ThreadCpuSeconds();
  const absl::Time wall0 = absl::Now();
  for (int i = 0; i < kPolls; ++i) {
    FetchResult r = all[i % providers]->Fetch(cursor);
    if (!r.page.has_value() || !r.page->items.empty()) return 1;
  }
  const double cpu = ThreadCpuSeconds() - cpu0;
  const double wall = absl::ToDoubleSeconds(absl::Now() - wall0);
  std::printf("caught-up polls: %d, client thread CPU %.1f us/poll, wall %.1f us/poll\n",
              kPolls, cpu / kPolls * 1e6, wall / kPolls * 1e6);
  // The same polls spaced out, then gathered in bursts (see the top).
  const int kSpaced = 330;
  for (int burst : {1, 11}) {
    const absl::Duration gap = burst == 1 ? absl::Milliseconds(20) : absl::Milliseconds(250);
    double spaced_cpu = 0;
    for (int i = 0; i < kSpaced; ++i) {
      if (i % burst == 0) absl::SleepFor(gap);
      const double c0 = ThreadCpuSeconds();
      FetchResult r = all[i % providers]->Fetch(cursor);
      spaced_cpu += ThreadCpuSeconds() - c0;
      if (!r.page.has_value()) return 1;
    }
    std::printf("polls in bursts of %d every %s: client thread CPU %.1f us/poll\n", burst,
                absl::FormatDuration(gap).c_str(), spaced_cpu / kSpaced * 1e6);
  }
  // The same polls, each provider on its own thread (as workers are), in turn.
  std::vector<sem_t> turn(providers);
  for (sem_t& t : turn) sem_init(&t, 0, 0);
  std::atomic<double> fetch_cpu{0};
  std::atomic<bool> failed{false};
  const int rounds = std::max(3, kPolls / providers);
  std::vector<std::thread> threads;
  for (int p = 0; p < providers; ++p) {
    threads.emplace_back([&, p] {
      for (int r = 0; r < rounds; ++r) {
        sem_wait(&turn[p]);
        const double c0 = ThreadCpuSeconds();
        FetchResult res = all[p]->Fetch(cursor);
        if (!res.page.has_value()) failed = true;
        double add = ThreadCpuSeconds() - c0;
        double cur = fetch_cpu.load();
        while (!fetch_cpu.compare_exchange_weak(cur, cur + add)) {}
        sem_post(&turn[(p + 1) % providers]);
      }
    });
  }
  sem_post(&turn[0]);
  for (std::thread& t : threads) t.join();
  std::printf("one thread per provider: Fetch CPU %.1f us/poll%s\n",
              fetch_cpu.load() / (rounds * providers) * 1e6, failed ? " (FAILED)" : "");
  return 0;
}

}  // namespace
}  // namespace handoff::consumer

int main(int argc, char** argv) { return handoff::consumer::Main(argc, argv); }
