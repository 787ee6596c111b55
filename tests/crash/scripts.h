// Page scripts for the crash-injection suite.
#ifndef HANDOFF_TESTS_CRASH_SCRIPTS_H_
#define HANDOFF_TESTS_CRASH_SCRIPTS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "consumer/testing/fakes.h"
#include "tests/crash/harness.h"

namespace handoff::tests {

// `pages` pages from `start`, each covering two blocks with three events; with
// `overlap`, each page after the first starts one block early and repeats the
// previous page's last block (an overlapping page).
inline Script LinearScript(uint64_t start, int pages, bool overlap = false) {
  using consumer::testing::MakePage;
  using consumer::testing::MakeRow;
  Script s;
  for (int i = 0; i < pages; ++i) {
    uint64_t b = start + 2 * i;
    uint64_t from = overlap && i > 0 ? b - 1 : b;
    std::vector<handoff::v1::EventRow> items;
    if (from < b) items.push_back(MakeRow(b - 1, 0));
    items.push_back(MakeRow(b, 0));
    items.push_back(MakeRow(b, 1));
    items.push_back(MakeRow(b + 1, 0));
    s.cursors.push_back(i == 0 ? std::to_string(start) : absl::StrCat("c", i));
    s.pages.push_back(MakePage(from, b + 1, std::move(items), absl::StrCat("c", i + 1)));
  }
  return s;
}

}  // namespace handoff::tests

#endif  // HANDOFF_TESTS_CRASH_SCRIPTS_H_
