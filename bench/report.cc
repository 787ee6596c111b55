#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "consumer/memory_bound.h"

namespace handoff::bench {
namespace {

using nlohmann::json;

struct Row {
  std::string scenario;
  std::string what;
  std::string measured;
  std::string limit;
  std::string ratio;
  std::string goal;
  std::string met;  // "yes", "no", "-" (no goal), "n/a" (not run / failed)
};

class Figures {
 public:
  explicit Figures(const json& raw) : raw_(raw) {}
  std::optional<double> Get(const std::string& probe, const std::string& field) const {
    if (!raw_.contains(probe)) return std::nullopt;
    const json& p = raw_[probe];
    if (p.contains("error") || !p.contains(field) || !p[field].is_number()) return std::nullopt;
    return p[field].get<double>();
  }
  // The probe's own CPU (user + system, all its threads) per million events.
  std::optional<double> CpuPerMillion(const std::string& probe) const {
    const auto cpu = Get(probe, "child_cpu_seconds"), events = Get(probe, "events");
    if (!cpu || !events || *events <= 0) return std::nullopt;
    return *cpu / *events * 1e6;
  }
  // Every run's `field` for a probe kept as the best of several (`each_<field>`, in run
  // order); empty for a probe that ran once.
  std::vector<double> Each(const std::string& probe, const std::string& field) const {
    std::vector<double> out;
    const std::string key = "each_" + field;
    if (!raw_.contains(probe) || !raw_[probe].contains(key)) return out;
    for (const json& v : raw_[probe][key]) {
      if (v.is_number()) out.push_back(v.get<double>());
    }
    return out.size() > 1 ? out : std::vector<double>();
  }
  std::string ErrorOf(const std::string& probe) const {
    if (!raw_.contains(probe)) return "not run";
    if (raw_[probe].contains("error")) return raw_[probe]["error"].get<std::string>();
    return "";
  }

 private:
  const json& raw_;
};

std::string Eps(std::optional<double> v) {
  if (!v) return "n/a";
  if (*v >= 1000) return absl::StrFormat("%.1fk ev/s", *v / 1000);
  return absl::StrFormat("%.0f ev/s", *v);
}
std::string Num(std::optional<double> v, const char* fmt = "%.2f") {
  return v ? absl::StrFormat(fmt, *v) : "n/a";
}
// "312.4k ev/s (4.07 s CPU per 1M events, steal 2.1%)": the rate, what it cost, and how
// much of the machine the hypervisor took during the run (this VM's noise).
std::string EpsAndCpu(const Figures& f, const std::string& probe) {
  const auto cpu = f.CpuPerMillion(probe);
  const auto steal = f.Get(probe, "run_steal_fraction");
  if (!cpu) return Eps(f.Get(probe, "events_per_s"));
  return absl::StrCat(Eps(f.Get(probe, "events_per_s")),
                      absl::StrFormat(" (%.2f s CPU per 1M events", *cpu),
                      steal ? absl::StrFormat(", steal %.1f%%", 100 * *steal) : "", ")");
}
// "; best of 3: 341.2k, 383.3k, 372.0k ev/s" for a probe kept as the best of several
// runs (nothing for one run): each run's figure, in run order, in `format`, then `unit`.
std::string BestOfNote(const Figures& f, const std::string& probe, const std::string& field,
                       double scale, const absl::FormatSpec<double>& format,
                       absl::string_view unit) {
  const std::vector<double> each = f.Each(probe, field);
  if (each.empty()) return "";
  std::string out = absl::StrCat("; best of ", each.size(), ": ");
  for (size_t i = 0; i < each.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", absl::StrFormat(format, each[i] * scale));
  }
  return absl::StrCat(out, unit);
}
std::string RatesNote(const Figures& f, const std::string& probe) {
  return BestOfNote(f, probe, "events_per_s", 1e-3, "%.1fk", " ev/s");
}

std::optional<double> Div(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b == 0) return std::nullopt;
  return *a / *b;
}
std::string YesNo(std::optional<bool> b) { return !b ? "n/a" : (*b ? "yes" : "no"); }

// The shape of an ingest run, from its probe name: sources and page items
// (e2e_<transport>_p<items>, many_<sources> at pages of 1000, mem_<sources> at 100).
struct IngestShape {
  double sources = 1, page = 1000;
  bool poll = true;
};
std::optional<IngestShape> ShapeOf(const std::string& name) {
  IngestShape shape;
  if (name.rfind("e2e_", 0) == 0) {
    shape.poll = name.rfind("e2e_poll_", 0) == 0;
  } else if (name.rfind("many_", 0) == 0) {
    shape.sources = std::stod(name.substr(5));
  } else if (name.rfind("mem_", 0) == 0) {
    shape.sources = std::stod(name.substr(4));
  } else {
    return std::nullopt;
  }
  if (absl::EndsWith(name, "_p100")) shape.page = 100;
  return shape;
}

// Least squares fit of rss = a + b*S + c*S*P (S sources, P page items).
struct MemoryFit {
  bool ok = false;
  double a = 0, b = 0, c = 0;
  struct Point {
    std::string probe;
    double s, p, rss;
  };
  std::vector<Point> points;
  double Predict(double s, double p) const { return a + b * s + c * s * p; }
};

MemoryFit FitMemory(const json& raw) {
  MemoryFit fit;
  for (const auto& [name, v] : raw.items()) {
    if (v.contains("error") || !v.contains("peak_rss_mb")) continue;
    const std::optional<IngestShape> shape = ShapeOf(name);
    if (!shape.has_value() || !shape->poll) continue;
    fit.points.push_back({name, shape->sources, shape->page, v["peak_rss_mb"].get<double>()});
  }
  if (fit.points.size() < 3) return fit;
  // Normal equations for x = (a, b, c) with rows (1, S, S*P).
  double m[3][4] = {{0}};
  for (const auto& pt : fit.points) {
    const double r[3] = {1, pt.s, pt.s * pt.p};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) m[i][j] += r[i] * r[j];
      m[i][3] += r[i] * pt.rss;
    }
  }
  for (int i = 0; i < 3; ++i) {
    int piv = i;
    for (int k = i + 1; k < 3; ++k) {
      if (std::fabs(m[k][i]) > std::fabs(m[piv][i])) piv = k;
    }
    if (std::fabs(m[piv][i]) < 1e-12) return fit;
    for (int j = 0; j < 4; ++j) std::swap(m[i][j], m[piv][j]);
    for (int k = 0; k < 3; ++k) {
      if (k == i) continue;
      const double f = m[k][i] / m[i][i];
      for (int j = 0; j < 4; ++j) m[k][j] -= f * m[i][j];
    }
  }
  fit.a = m[0][3] / m[0][0];
  fit.b = m[1][3] / m[1][1];
  fit.c = m[2][3] / m[2][2];
  fit.ok = true;
  return fit;
}

std::string BoundFormula() {
  return absl::StrFormat(
      "peak RSS <= R0 + storage ceiling + S x T + b x (%.2f x P + %.1f x polling sources + "
      "%.2f x SSE sources + %.2f x W + %.1f x min(S, %d) + %.0f)",
      consumer::SlotPageFactor(), consumer::PollSourcePageFactor(),
      consumer::SseSourcePageFactor(), consumer::WaitingSourcePageFactor(),
      consumer::kDomBytesPerWireByte,
      static_cast<int>(consumer::DomParsers()), consumer::ProcessPageFactor());
}

// The memory bound of every ingest run (consumer/memory_bound.h, store.h):
// peak RSS <= base + storage ceiling + S x per-source fixed cost + page bound, where the
// per-source fixed cost is what each idle source added to the idle probe's process.
struct MemoryBound {
  struct Run {
    std::string probe;
    double sources, page, largest_page_kb, rss, bound, base, store, fixed, pages;
  };
  std::optional<double> per_source_mb;  // from the idle probe
  std::vector<Run> runs;
  double worst = 0;  // the largest peak / bound
  bool ok() const { return per_source_mb.has_value() && !runs.empty(); }
};

MemoryBound BoundMemory(const json& raw) {
  MemoryBound out;
  if (raw.contains("idle") && !raw["idle"].contains("error") &&
      raw["idle"].contains("base_rss_mb")) {
    const json& idle = raw["idle"];
    out.per_source_mb = (idle["peak_rss_mb"].get<double>() - idle["base_rss_mb"].get<double>()) /
                        idle["sources"].get<double>();
  }
  for (const auto& [name, v] : raw.items()) {
    const std::optional<IngestShape> shape = ShapeOf(name);
    if (v.contains("error") || !v.contains("page_bound_mb") || !shape.has_value()) continue;
    MemoryBound::Run r;
    r.probe = name;
    r.sources = shape->sources;
    r.page = shape->page;
    r.largest_page_kb = v["largest_page_bytes"].get<double>() / 1024;
    r.rss = v["peak_rss_mb"].get<double>();
    r.base = v["base_rss_mb"].get<double>();
    r.store = v["store_ceiling_mb"].get<double>();
    r.pages = v["page_bound_mb"].get<double>();
    r.fixed = r.sources * out.per_source_mb.value_or(0);
    r.bound = r.base + r.store + r.fixed + r.pages;
    out.worst = std::max(out.worst, r.rss / r.bound);
    out.runs.push_back(r);
  }
  return out;
}

std::vector<Row> BuildRows(const json& raw, const MemoryBound& bound) {
  Figures f(raw);
  std::vector<Row> rows;
  const auto bare = f.Get("bare_rocks", "events_per_s");
  const auto sim1000 = f.Get("sim_alone_p1000", "events_per_s");
  const auto sim100 = f.Get("sim_alone_p100", "events_per_s");
  for (const char* t : {"poll", "sse"}) {
    for (int page : {1000, 100}) {
      const std::string probe = absl::StrCat("e2e_", t, "_p", page);
      const auto v = f.Get(probe, "events_per_s");
      const auto ratio = Div(v, bare);
      Row r;
      r.scenario = "1 end to end";
      r.what = absl::StrCat(t == std::string("poll") ? "poll" : "SSE", ", 1 source, pages of ",
                            page, ", local rows, sync");
      r.measured = absl::StrCat(EpsAndCpu(f, probe), RatesNote(f, probe));
      r.limit = absl::StrCat("bare RocksDB ", EpsAndCpu(f, "bare_rocks"),
                             RatesNote(f, "bare_rocks"), "; simulator alone ",
                             Eps(page == 1000 ? sim1000 : sim100));
      if (page == 1000 && raw.contains("bare_rocks_synced_batches")) {
        absl::StrAppend(&r.limit, "; bare RocksDB syncing every batch as written (context) ",
                        Eps(f.Get("bare_rocks_synced_batches", "events_per_s")));
      }
      r.ratio = Num(ratio);
      if (page == 1000) {
        r.goal = ">= 150k ev/s and >= 0.80 of bare RocksDB";
        r.met = YesNo(v && ratio ? std::optional<bool>(*v >= 150000 && *ratio >= 0.8)
                                 : std::nullopt);
      } else {
        r.goal = "-";
        r.met = "-";
      }
      rows.push_back(r);
    }
  }
  if (raw.contains("far_poll_p1000")) {
    const auto v = f.Get("far_poll_p1000", "events_per_s");
    Row r;
    r.scenario = "1 (context)";
    r.what = absl::StrCat("poll, 1 source, pages of 1000, local rows, sync; provider farther "
                          "away (each response held ",
                          raw["far_poll_p1000"].value("provider_delay_ms", 0), " ms)");
    r.measured = EpsAndCpu(f, "far_poll_p1000");
    r.limit = absl::StrCat("bare RocksDB ", EpsAndCpu(f, "bare_rocks"));
    r.ratio = Num(Div(v, bare));
    r.goal = "-";
    r.met = "-";
    rows.push_back(r);
  }
  // The one-source figure: scenario 1's poll run at pages of 1000 is the same probe as
  // this scenario's one source (one source, poll, pages of 1000, local rows), so the
  // higher of the two is the figure the sources are held to: a run of either that the
  // VM slowed must not lower the bar (in three full runs scenario 2's one source ran
  // 9-25% below scenario 1's, bench/HISTORY.md 120). The most sources run as many times
  // as the two have runs together (handoff_bench.cc), so both sides are a best of as
  // many draws (123).
  const auto here = f.Get("many_1", "events_per_s");
  const auto scenario1 = f.Get("e2e_poll_p1000", "events_per_s");
  const auto one = here && scenario1 ? std::optional<double>(std::max(*here, *scenario1))
                                     : (here ? here : scenario1);
  const bool one_from_scenario1 = scenario1 && (!here || *scenario1 > *here);
  const auto bare_many = f.Get("bare_rocks_many", "events_per_s");
  std::vector<std::string> many;
  for (const auto& [name, v] : raw.items()) {
    if (name.rfind("many_", 0) == 0) many.push_back(name);
  }
  std::sort(many.begin(), many.end(), [](const std::string& x, const std::string& y) {
    return std::stoi(x.substr(5)) < std::stoi(y.substr(5));
  });
  for (size_t i = 0; i < many.size(); ++i) {
    const std::string& name = many[i];
    const auto v = f.Get(name, "events_per_s");
    Row r;
    r.scenario = "2 many sources";
    r.what = absl::StrCat(name.substr(5), " sources, poll, pages of 1000 (fairness: per-source "
                          "rate min/max ", Num(f.Get(name, "rate_fairness")), ", progress at "
                          "half time min/max ", Num(f.Get(name, "fairness")), "; ",
                          Num(f.Get(name, "events_per_commit"), "%.0f"), " ev/commit; SYN "
                          "retransmissions ", Num(f.Get(name, "syn_retransmits"), "%.0f"), ")");
    r.measured = absl::StrCat(EpsAndCpu(f, name), RatesNote(f, name));
    const bool largest = i + 1 == many.size() && many.size() > 1;
    r.limit = absl::StrCat("1 source ", EpsAndCpu(f, "many_1"));
    if (scenario1) {
      absl::StrAppend(&r.limit, " here, ", EpsAndCpu(f, "e2e_poll_p1000"),
                      " in scenario 1 (the same probe; the ratio uses the ",
                      one_from_scenario1 ? "latter" : "former", ")");
    }
    absl::StrAppend(&r.limit, "; bare RocksDB ", Eps(bare));
    if (largest && bare_many) {
      // How much of the goal the storage itself meets: its many writers against its one.
      absl::StrAppend(&r.limit, " (1 writer), ", Eps(bare_many), " (",
                      Num(f.Get("bare_rocks_many", "sources"), "%.0f"), " writers, ",
                      Num(Div(bare_many, bare)), " of 1 writer)");
    }
    if (largest) {
      const int one_runs =
          static_cast<int>((here ? f.Get("many_1", "runs").value_or(1) : 0) +
                           (scenario1 ? f.Get("e2e_poll_p1000", "runs").value_or(1) : 0));
      absl::StrAppend(&r.limit, "; best of ", Num(f.Get(name, "runs"), "%.0f"),
                      " runs here against the best of ", one_runs, " one-source runs");
    }
    r.ratio = Num(Div(v, one));
    r.goal = largest ? ">= the 1-source figure (group commit)" : "-";
    r.met = largest ? YesNo(v && one ? std::optional<bool>(*v >= *one) : std::nullopt) : "-";
    rows.push_back(r);
  }
  for (const char* mode : {"single", "batch"}) {
    const auto direct = f.Get(absl::StrCat("sink_direct_", mode), "events_per_s");
    for (const char* gate : {"immediate", "finalized"}) {
      const auto v = f.Get(absl::StrCat("sink_", mode, "_", gate), "events_per_s");
      const auto ratio = Div(v, direct);
      Row r;
      r.scenario = "3 external sink";
      r.what = absl::StrCat(mode == std::string("single") ? "single Apply" : "ApplyBatch of 256",
                            ", ", gate == std::string("immediate") ? "IMMEDIATE" : "FINALIZED",
                            " gate");
      r.measured = absl::StrCat(Eps(v), RatesNote(f, absl::StrCat("sink_", mode, "_", gate)));
      r.limit = absl::StrCat("sink called directly ", Eps(direct),
                             RatesNote(f, absl::StrCat("sink_direct_", mode)));
      r.ratio = Num(ratio);
      const bool batch = mode == std::string("batch");
      r.goal = batch ? ">= 0.70 of the sink's own speed" : "-";
      r.met = batch ? YesNo(ratio ? std::optional<bool>(*ratio >= 0.7) : std::nullopt) : "-";
      rows.push_back(r);
    }
  }
  {
    // The goal is judged on handoffd started as a process when the run has it; the
    // in-process run splits the time into the store's open and Recover.
    const bool process = f.Get("recovery_handoffd", "first_commit_seconds").has_value();
    const char* probe = process ? "recovery_handoffd" : "recovery";
    const auto v = f.Get(probe, "first_commit_seconds");
    Row r;
    r.scenario = "4 recovery";
    r.what = absl::StrCat(
        process ? "handoffd's exec to the first new commit its admin API reports (an upper "
                  "bound; admin API serving at " +
                      Num(f.Get(probe, "admin_serving_seconds"), "%.3f") + " s), "
                : "start to first new commit (in process), ",
        Num(f.Get(probe, "sources"), "%.0f"), " sources, ", Num(f.Get(probe, "receipts"), "%.0f"),
        " receipts on disk, ", Num(f.Get(probe, "wal_rows_replayed"), "%.0f"),
        " rows in the WAL to replay; database out of the page cache (",
        Num(f.Get(probe, "evicted_mb"), "%.0f"), " MB dropped, ",
        Num(f.Get(probe, "resident_after_eviction_mb"), "%.1f"),
        " MB left); in process, as cold: open ", Num(f.Get("recovery", "open_seconds"), "%.3f"),
        " s, Recover done ", Num(f.Get("recovery", "recover_seconds"), "%.3f"),
        " s, first commit ", Num(f.Get("recovery", "first_commit_seconds"), "%.3f"), " s");
    r.measured = v ? absl::StrFormat("%.3f s", *v) : "n/a";
    r.limit = "-";
    r.ratio = "-";
    r.goal = "< 1 s";
    r.met = YesNo(v ? std::optional<bool>(*v < 1.0) : std::nullopt);
    rows.push_back(r);
  }
  {
    Row r;
    r.scenario = "5 memory";
    r.what = "peak RSS of the Handoff process, S sources, largest page b bytes";
    r.measured = bound.ok() ? absl::StrFormat("peak <= bound in %d of %d runs",
                                              std::count_if(bound.runs.begin(), bound.runs.end(),
                                                            [](const MemoryBound::Run& x) {
                                                              return x.rss <= x.bound;
                                                            }),
                                              bound.runs.size())
                            : "n/a";
    r.limit = BoundFormula();
    r.ratio = bound.ok() ? absl::StrFormat("peak/bound <= %.2f", bound.worst) : "-";
    r.goal = "bounded, stated as a formula";
    r.met = YesNo(bound.ok() ? std::optional<bool>(bound.worst <= 1.0) : std::nullopt);
    rows.push_back(r);
  }
  // Row 6 is the goal: handoffd's defaults, and a caller that stands in for one on
  // another machine (probes.cc). The other two say what each side's scheduling adds.
  for (const char* probe : {"admin", "admin_caller_normal", "admin_no_rt"}) {
    const std::string name = probe;
    const auto p50 = f.Get(probe, "p50_ms"), p99 = f.Get(probe, "p99_ms");
    if (name != "admin" && !raw.contains(probe)) continue;
    const json& p = raw.contains(probe) ? raw[probe] : json::object();
    const int realtime_threads = p.value("server_realtime_threads", 0);
    const std::string threads =
        realtime_threads > 0 ? absl::StrCat("SCHED_RR (", realtime_threads, " threads)")
                             : std::string("normal");
    std::string setup;
    if (name == "admin") {
      setup = absl::StrCat("admin threads ", threads, "; the caller ",
                           p.value("caller_policy", std::string("n/a")),
                           ", standing in for a remote caller");
    } else if (name == "admin_caller_normal") {
      setup = absl::StrCat("admin threads ", threads,
                           "; the caller at normal priority on the same saturated cores");
    } else {
      setup = absl::StrCat("handoffd --admin_realtime_priority=0, as without CAP_SYS_NICE ",
                           "(admin threads ", threads, "); the caller at normal priority");
    }
    Row r;
    r.scenario = name == "admin" ? "6 admin latency" : "6 (context)";
    r.what = absl::StrCat("GetProgress while ingesting (",
                          p.value("transport", std::string("n/a")), ", ingest ",
                          Eps(f.Get(probe, "ingest_events_per_s")), "; ", setup, ")");
    // An absolute threshold: the verdict takes the median run's p99 (the lowest of
    // several would favour "yes"), and needs ingest to have run through the window.
    std::vector<double> each = f.Each(probe, "p99_ms");
    std::optional<double> median = p99;
    if (!each.empty()) {
      std::sort(each.begin(), each.end());
      median = each[each.size() / 2];
    }
    const bool ingesting = raw.contains(probe) && raw[probe].value("ingest_still_running", false);
    r.measured = absl::StrCat(
        "p50 ", Num(p50, "%.3f"), " ms, p99 ", Num(p99, "%.3f"), " ms",
        BestOfNote(f, probe, "p99_ms", 1, "%.2f", " ms (p99; the lowest shown)"),
        "; median p99 ", Num(median, "%.3f"), " ms",
        ingesting ? "" : "; ingest ended inside the window");
    r.limit = "-";
    if (raw.contains(probe) && raw[probe].contains("idle_server")) {
      const json& idle = raw[probe]["idle_server"];
      r.limit = absl::StrFormat("same server, not ingesting: p50 %.3f ms, p99 %.3f ms",
                                idle.value("p50_ms", 0.0), idle.value("p99_ms", 0.0));
      // The hypervisor's share of the vCPUs' time (steal) in each window.
      if (raw[probe].contains("steal_fraction")) {
        absl::StrAppend(&r.limit,
                        absl::StrFormat("; steal %.1f%% ingesting, %.1f%% not",
                                        100 * raw[probe].value("steal_fraction", 0.0),
                                        100 * idle.value("steal_fraction", 0.0)));
      }
    }
    r.ratio = "-";
    r.goal = name == "admin" ? "median run's p99 < 2 ms" : "p99 < 2 ms (context)";
    r.met = name != "admin" ? "-"
                            : YesNo(median ? std::optional<bool>(*median < 2.0 && ingesting)
                                           : std::nullopt);
    rows.push_back(r);
  }
  for (const char* probe : {"idle_sse", "idle"}) {
    const bool sse = std::string(probe) == "idle_sse";
    const auto v = f.Get(probe, "core_fraction");
    // The hypervisor's share of the vCPUs' time over the window (older reports: absent).
    const auto steal = f.Get(probe, "steal_fraction");
    Row r;
    r.scenario = "7 idle cost";
    const bool handoffd =
        raw.contains(probe) && raw[probe].value("process", std::string()) == "handoffd";
    r.what = absl::StrCat(Num(f.Get(probe, "sources"), "%.0f"), sse ? " SSE" : " polling",
                          " sources, nothing new upstream (",
                          handoffd ? "handoffd's CPU, every thread" : "in-process engine",
                          ", over ",
                          Num(f.Get(probe, "window_seconds"), "%.0f"), " s; ",
                          sse ? "heartbeat frames only"
                              : absl::StrCat(Num(f.Get(probe, "polls_per_s"), "%.1f"),
                                             " polls/s at ",
                                             Num(f.Get(probe, "cpu_us_per_poll"), "%.0f"),
                                             " us of CPU, ",
                                             Num(f.Get(probe, "context_switches_per_poll"),
                                                 "%.0f"),
                                             " context switches and ",
                                             Num(f.Get(probe, "minor_faults_per_poll"), "%.1f"),
                                             " page faults each"),
                          steal ? absl::StrFormat("; steal %.1f%%", *steal * 100) : "", ")");
    r.measured = v ? absl::StrFormat("%.2f%% of a core", *v * 100) : "n/a";
    r.limit = "-";
    r.ratio = "-";
    r.goal = "< 2% of a core";
    r.met = YesNo(v ? std::optional<bool>(*v < 0.02) : std::nullopt);
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

absl::Status WriteReport(const Results& res, const std::string& out_dir) {
  const MemoryFit fit = FitMemory(res.raw);
  const MemoryBound bound = BoundMemory(res.raw);
  const std::vector<Row> rows = BuildRows(res.raw, bound);
  const Machine& m = res.machine;

  std::string md = "# Handoff benchmark report\n\n";
  absl::StrAppend(&md, "Generated by `scripts/bench` (`//bench:handoff_bench`, `-c opt`)",
                  res.smoke ? " in **smoke mode** (tiny sizes: figures mean nothing)" : "",
                  ". Every limit is measured in the same run, on the same machine.\n\n");
  absl::StrAppend(&md, "| date | machine |\n| --- | --- |\n| ", m.date, " | nproc ", m.nproc,
                  ", ", m.cpu, ", ", m.kernel, " |\n\n");
  md += "| scenario | what | measured | limit (same run) | ratio | goal | met |\n";
  md += "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Row& r : rows) {
    absl::StrAppend(&md, "| ", r.scenario, " | ", r.what, " | ", r.measured, " | ", r.limit,
                    " | ", r.ratio, " | ", r.goal, " | ", r.met, " |\n");
  }
  md += "\n## Memory (scenario 5)\n\n";
  absl::StrAppend(&md, "**The bound.** ", BoundFormula(),
                  ", where S counts sources and b is the largest page body a source receives "
                  "(at most the provider's `max_page_bytes`, 64 MiB by default). Each term "
                  "is a cap, not a fit:\n\n");
  md +=
      "- R0: the process before any source (binary, libraries, an open database), "
      "measured by each probe once the store is open.\n"
      "- storage ceiling (`store::StoreMemoryCeiling`): every column family's memtables "
      "at RocksDB's stop limit (`max_write_buffers` = 2 of `write_buffer_bytes` for rows, "
      "outbox and receipts, 4 MiB for the others, each up to an arena block and a write "
      "group more) plus the block cache. When the disk falls "
      "behind, RocksDB stops the writes instead of growing memory.\n"
      "- T: what one source costs without pages (its thread, its libcurl handle, its "
      "buffers), measured as the idle probe's growth per source.\n"
      "- b x ...: every buffer that grows with a page (`consumer/memory_bound.h`). P, the "
      "page slots every source shares (`--max_pages_in_flight`, the bench runs handoffd's "
      "default, 8 per core and at least 16): a page exists only under a slot, each "
      "holding a receive buffer 2b and a parsed page 3.25b (the page being committed, "
      "the prefetched one, the SSE-queued ones, the deleter's). Per polling source the "
      "step's batch 1.5b; per SSE source its stream buffers 3b (a frame waits there for "
      "room and a slot: it is parsed only under one) and the batch. W, sources waiting "
      "with a page (blocked on a hold or a retry; 0 in these runs): such a page gives its "
      "slot back and keeps its 3.25b. Per process the shared simdjson parsers' DOM "
      "allocations, 13.7b each, one per source up to one per core (2-8), and the row "
      "pool's 32 pages. The rows and encoded-rows factors are asserted by "
      "`page_parser_test` over the worst item shapes.\n\n";
  if (bound.ok()) {
    absl::StrAppend(&md, absl::StrFormat("T = %.2f MB per source (idle probe). ",
                                         *bound.per_source_mb));
    md += "Every ingest run of this report against its bound:\n\n"
          "| run | S | page items | b | peak RSS | R0 | storage | S x T | pages | bound | "
          "peak/bound |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const MemoryBound::Run& r : bound.runs) {
      absl::StrAppend(&md, absl::StrFormat(
          "| %s | %.0f | %.0f | %.0f KB | %.1f MB | %.1f | %.0f | %.1f | %.1f | %.0f MB | %.2f |\n",
          r.probe, r.sources, r.page, r.largest_page_kb, r.rss, r.base, r.store, r.fixed,
          r.pages, r.bound, r.rss / r.bound));
    }
  } else {
    md += "The bound needs the idle probe (T) and the ingest runs of this report.\n";
  }
  if (fit.ok) {
    absl::StrAppend(&md, absl::StrFormat(
        "\n**Typical use** (least-squares fit over the polling runs, not a bound): peak "
        "RSS ~ %.1f MB + %.2f MB x sources + %.2f KB x sources x page items. Memory does "
        "not grow with the number of events ingested.\n",
        fit.a, fit.b, fit.c * 1024));
  }
  md += "\nPeak RSS of every child process:\n\n| probe | peak RSS | CPU |\n| --- | --- | --- |\n";
  for (const auto& [name, v] : res.raw.items()) {
    absl::StrAppend(&md, absl::StrFormat("| %s | %.1f MB | %.1f s |\n", name,
                                         v.value("peak_rss_mb", 0.0),
                                         v.value("child_cpu_seconds", 0.0)));
  }
  bool any_error = false;
  for (const auto& [name, v] : res.raw.items()) {
    if (!v.contains("error")) continue;
    if (!any_error) md += "\n## Failures\n\n";
    any_error = true;
    absl::StrAppend(&md, "- `", name, "`: ", v["error"].get<std::string>(), "\n");
  }
  md += "\n## How each figure is measured\n\n"
        "- Each probe runs in a child process of `handoff_bench`; the parent hosts the "
        "provider simulator (`sim::ProviderSim`, loopback HTTP) and the sample sink "
        "(`sim::SampleSink`, loopback gRPC), so peak RSS and CPU are Handoff's own. The parent "
        "runs at nice 10 and each probe at nice 0: the helpers stand in for remote services "
        "and must not take the CPU of the process under test. Every row with a goal and "
        "the limit it is compared with (scenario 1's poll and SSE at pages of 1000 and bare "
        "RocksDB; scenario 2's one and 64 sources and the bare loop with 64 writers; "
        "scenario 3's ApplyBatch rows and the sink called directly; scenario 6's three "
        "configurations) run several times in a full run, interleaved, each keeping its "
        "best run (the highest rate, the lowest p99), and the row lists every run's figure "
        "in run order (\"best of N\"; `each_events_per_s`, `each_p99_ms` in report.json): "
        "on this shared VM one configuration's rate has moved 1.5x between back-to-back "
        "runs, and the best of several estimates what each side of a ratio does when the "
        "machine lets it. "
        "\"s CPU per 1M events\" is the "
        "probe process's user and system time over its run, per million events (the "
        "simulator's excluded): steadier than events/s when the machine's neighbours vary, "
        "though not immune (the same build's figure has moved 1.7x within minutes on this "
        "VM); \"steal\" beside it is the share of the machine's time the hypervisor took "
        "during that run (/proc/stat). report.json also keeps each run's context switches, "
        "first page touches and the helpers' CPU (`helper_cpu_seconds`).\n"
        "- End to end: a real `Store` (sync on, in a temp dir on disk) and `SourceManager` "
        "with handoffd's `HttpProvider`; events/s = events durably committed / time from "
        "StartSource to the last commit. Bare RocksDB: the same rows (simulator logs as "
        "stored rows, `store/row_codec.h`; keys from `store/keys.h`), "
        "`store::StoreRocksOptions`, one WriteBatch per 1000 rows plus the checkpoint, "
        "synced with the engine's policy: written unsynced, one background fsync paced as "
        "the store's (`store::WalSyncer`, 5 ms) covers every batch written before it began, "
        "at most 4 batches unsynced per writer (`WorkerOptions::max_unsynced_pages`), and "
        "the run ends when the last batch is synced (before round 36 each batch was synced "
        "as written, a slower limit; that figure is kept as context). Simulator alone: one "
        "libcurl "
        "client following `next`, body discarded. The simulator's SSE bodies end with the "
        "connection (HTTP/1.1 close-delimited) rather than chunked, which cost it ~30% more "
        "CPU on the shared cores; the client reads both (`http_provider_test`). The "
        "provider farther away (context, run once) is the same poll run against a "
        "simulator that holds each polled response before rendering it "
        "(`sim::ProviderSimOptions::response_delay`).\n"
        "- Many sources: rate fairness = min/max of each source's events/s over its own "
        "span (first to last commit); progress fairness = min/max of per-source events "
        "committed at the commit that brought in half of all events. All sources are "
        "started at once, from one thread each, as at process start.\n"
        "- External sink: one source, `GrpcEventSink` to the sample sink (fsync per call); "
        "the limit is the same sink called directly (sequential Apply, or ApplyBatch of 256) "
        "with the same work: the rows the simulator serves, under the engine's idempotency "
        "key format (the sink looks each key up and writes it). FINALIZED counts the events "
        "delivered from the outbox (blocks <= head - 32).\n"
        "- Recovery: the data set (one SST per source, bulk-ingested) is cached under the "
        "bench data dir; each run points the sources at this run's simulator and rewinds "
        "them, and leaves the last 1500 rows of each source in the write-ahead log, unflushed, "
        "as a crash mid-ingest does (~50 MB, most of a 64 MiB memtable: the open replays them "
        "and flushes them to L0); then drops the database's files (and handoffd's binary) "
        "from the page cache (`posix_fadvise(DONTNEED)`, checked with `mincore`) and starts "
        "handoffd: the time from `posix_spawn` to the first ListSources answer showing a "
        "source applied past the data set (polled back to back from when the port file "
        "appears; workers start before the admin API serves, so this is an upper bound). "
        "The same cold start inside the harness's process splits it: Store::Open, then "
        "SourceManager::Create + Recover, then the first commit (the engine's observer). "
        "Its limit: the shared libraries (RocksDB, gRPC) stay in the page cache.\n"
        "- Admin: handoffd (`--insecure_disable_auth`); one GetProgress per millisecond over "
        "loopback gRPC, first for up to 3 s with the source created but not started (the "
        "machine's floor), then while it ingests at full speed (the run must still be "
        "ingesting at its end); three runs, the one with the lowest p99 is shown with its "
        "own idle floor and steal, and the goal is judged on the median run's p99.\n"
        "- Idle: handoffd's CPU over the window (/proc/PID/stat utime+stime, every thread: "
        "workers, idle poller, health reporter, gRPC server, metrics), after "
        "every source caught up; polling: after its idle backoff reached the cap (3 windows), "
        "polls counted by the simulator (its /sim/status), and the simulator closes a connection "
        "idle for 1 s (every idle poll opens a new one; kept alive, cpp-httplib's wait "
        "for the next request polls each connection every ~10 ms, which with 1000 "
        "connections saturated this machine); SSE: the window spans a whole 30 s "
        "heartbeat period.\n";
  if (!res.history.empty()) {
    md += "\n## History\n\n";
    md += res.history;
    if (md.back() != '\n') md += "\n";
  }

  json out;
  out["date"] = m.date;
  out["machine"] = {{"nproc", m.nproc}, {"cpu", m.cpu}, {"kernel", m.kernel}};
  out["smoke"] = res.smoke;
  out["rows"] = json::array();
  for (const Row& r : rows) {
    out["rows"].push_back({{"scenario", r.scenario}, {"what", r.what}, {"measured", r.measured},
                           {"limit", r.limit}, {"ratio", r.ratio}, {"goal", r.goal},
                           {"met", r.met}});
  }
  if (fit.ok) out["memory_formula_mb"] = {{"base", fit.a}, {"per_source", fit.b},
                                          {"per_source_per_page_item", fit.c}};
  if (bound.ok()) {
    out["memory_bound"] = {{"per_source_fixed_mb", *bound.per_source_mb},
                           {"worst_peak_over_bound", bound.worst}};
  }
  out["probes"] = res.raw;

  std::ofstream md_file(out_dir + "/REPORT.md");
  md_file << md;
  std::ofstream json_file(out_dir + "/report.json");
  json_file << out.dump(2) << "\n";
  if (!md_file || !json_file) return absl::InternalError("cannot write the report files");
  return absl::OkStatus();
}

}  // namespace handoff::bench
