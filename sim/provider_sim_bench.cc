// How many pages of 1000 logs the simulator serves per second over loopback, so that
// benchmarks of Handoff are known to measure Handoff. Clients are libcurl loops that
// follow `next` and discard the body (no parsing).
//   bazel run -c opt //sim:provider_sim_bench -- [clients] [pages per client]
#include <curl/curl.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sim/provider_sim.h"

namespace {

size_t Collect(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// Follows cursors from block 0; returns the bytes received.
size_t Client(const std::string& base, const std::string& source, int pages) {
  CURL* curl = curl_easy_init();
  std::string body, cursor = "0";
  size_t bytes = 0;
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  for (int i = 0; i < pages; ++i) {
    std::string url = absl::StrCat(base, "/v1/pages?chain=sim&source=", source,
                                   "&filter=all&limit=1000&from=", cursor);
    body.clear();
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    long status = 0;
    if (curl_easy_perform(curl) != CURLE_OK ||
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK || status != 200) {
      std::fprintf(stderr, "request failed\n");
      std::exit(1);
    }
    bytes += body.size();
    size_t at = body.find("\"next\":\"");
    size_t end = body.find('"', at + 8);
    cursor = body.substr(at + 8, end - at - 8);
  }
  curl_easy_cleanup(curl);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const int clients = argc > 1 ? std::atoi(argv[1]) : 2;
  const int pages = argc > 2 ? std::atoi(argv[2]) : 1000;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  handoff::sim::ProviderSimOptions o;
  o.chain.logs_per_block = 10;
  o.chain.initial_head = 100 * static_cast<uint64_t>(pages) + 10;
  handoff::sim::ProviderSim sim(o);
  if (!sim.Start(0).ok()) return 1;
  std::atomic<size_t> bytes{0};
  absl::Time t0 = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] { bytes += Client(sim.base_url(), absl::StrCat("s", c), pages); });
  }
  for (auto& t : threads) t.join();
  double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  double total = static_cast<double>(clients) * pages;
  std::printf("%d clients x %d pages of 1000 logs: %.0f pages/s, %.1f MB/s, %.0f KB/page\n",
              clients, pages, total / secs, bytes / secs / 1e6, bytes / total / 1e3);
  sim.Stop();
  return 0;
}
