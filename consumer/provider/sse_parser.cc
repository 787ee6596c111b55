#include "consumer/provider/sse_parser.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace handoff::consumer {

SseParser::SseParser(size_t max_frame_bytes, size_t data_slack)
    : max_frame_bytes_(max_frame_bytes), data_slack_(data_slack) {}

void SseParser::GiveBack(std::string data) {
  if (data.capacity() > data_.capacity() && data_.empty()) {
    data_ = std::move(data);
    data_.clear();
  }
}

void SseParser::AppendData(absl::string_view bytes) {
  const size_t need = data_.size() + bytes.size() + data_slack_;
  if (data_.capacity() < need) data_.reserve(std::max(need, 2 * data_.capacity()));
  data_.append(bytes.data(), bytes.size());
}

void SseParser::MaybeStreamDataLine() {
  // "data:" and one more byte: enough to drop the optional space after the colon.
  constexpr absl::string_view kData = "data:";
  if (line_.size() <= kData.size() || !absl::StartsWith(line_, kData)) return;
  absl::string_view value = absl::string_view(line_).substr(kData.size());
  if (value[0] == ' ') value.remove_prefix(1);
  AddDataValue(value);
  any_field_ = true;
  in_data_line_ = true;
  line_.clear();
}

void SseParser::AddDataValue(absl::string_view value) {
  if (has_data_) AppendData("\n");  // data lines of one frame join with '\n'
  AppendData(value);
  has_data_ = true;
}

absl::Status SseParser::Fail() {
  failed_ = true;
  line_.clear();
  line_.shrink_to_fit();
  data_.clear();
  data_.shrink_to_fit();
  return absl::ResourceExhaustedError(
      absl::StrCat("SSE frame exceeds ", max_frame_bytes_, " bytes"));
}

absl::Status SseParser::Feed(absl::string_view chunk, const FrameCallback& on_frame) {
  if (failed_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("SSE frame exceeds ", max_frame_bytes_, " bytes"));
  }
  if (at_stream_start_) {
    // A UTF-8 byte order mark at the very start of the stream is not part of it (the SSE
    // spec's UTF-8 decode drops one); its bytes may arrive in several reads.
    static constexpr absl::string_view kBom = "\xEF\xBB\xBF";
    while (!chunk.empty() && bom_bytes_ < kBom.size() && chunk[0] == kBom[bom_bytes_]) {
      chunk.remove_prefix(1);
      ++bom_bytes_;
    }
    if (bom_bytes_ == kBom.size()) {
      at_stream_start_ = false;
    } else if (!chunk.empty()) {
      // Not a mark after all: the bytes held back begin the first line (none is CR/LF).
      line_.assign(kBom.data(), bom_bytes_);
      at_stream_start_ = false;
    } else {
      return absl::OkStatus();  // all of it so far may be the start of a mark
    }
  }
  const char* const begin = chunk.data();
  const size_t n = chunk.size();
  size_t pos = 0;
  if (n > 0 && skip_lf_) {
    skip_lf_ = false;
    if (begin[0] == '\n') pos = 1;
  }
  // Positions of the next CR and LF at or after `pos` (n when none): each memchr scans a
  // byte at most once per Feed, so the work is linear even for many short lines.
  size_t next_cr = 0, next_lf = 0;
  bool cr_valid = false, lf_valid = false;
  while (pos < n) {
    if (!cr_valid || next_cr < pos) {
      const void* p = std::memchr(begin + pos, '\r', n - pos);
      next_cr = p ? static_cast<size_t>(static_cast<const char*>(p) - begin) : n;
      cr_valid = true;
    }
    if (!lf_valid || next_lf < pos) {
      const void* p = std::memchr(begin + pos, '\n', n - pos);
      next_lf = p ? static_cast<size_t>(static_cast<const char*>(p) - begin) : n;
      lf_valid = true;
    }
    const size_t eol = next_cr < next_lf ? next_cr : next_lf;
    const size_t len = eol - pos;
    if (Retained() + line_.size() + len > max_frame_bytes_) return Fail();
    if (in_data_line_) {
      AppendData(absl::string_view(begin + pos, len));
      if (eol == n) break;
      in_data_line_ = false;  // the data line ended; its value is already in data_
    } else if (eol == n) {
      line_.append(begin + pos, len);
      MaybeStreamDataLine();
      break;
    } else if (line_.empty()) {
      ProcessLine(absl::string_view(begin + pos, len), on_frame);
    } else {
      line_.append(begin + pos, len);
      ProcessLine(line_, on_frame);
      line_.clear();
    }
    if (begin[eol] == '\r') {
      if (eol + 1 == n) {
        skip_lf_ = true;
        pos = n;
      } else {
        pos = begin[eol + 1] == '\n' ? eol + 2 : eol + 1;
      }
    } else {
      pos = eol + 1;
    }
  }
  return absl::OkStatus();
}

void SseParser::ProcessLine(absl::string_view line, const FrameCallback& on_frame) {
  if (line.empty()) {
    if (any_field_) {
      SseFrame frame;
      frame.id = std::move(id_);
      frame.has_id = has_id_;
      frame.event = std::move(event_);
      frame.data = std::move(data_);
      frame.has_data = has_data_;
      frame.retry_ms = retry_ms_;
      on_frame(std::move(frame));
    }
    id_.clear();
    event_.clear();
    data_.clear();
    has_id_ = has_data_ = any_field_ = false;
    retry_ms_.reset();
    return;
  }
  if (line[0] == ':') return;  // comment
  absl::string_view name = line, value;
  size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    name = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (name == "data") {
    AddDataValue(value);
  } else if (name == "event") {
    event_.assign(value.data(), value.size());
  } else if (name == "id") {
    if (value.find('\0') != absl::string_view::npos) return;  // ignored, as in the spec
    id_.assign(value.data(), value.size());
    has_id_ = true;
  } else if (name == "retry") {
    if (value.empty() || value.size() > 18) return;
    int64_t ms = 0;
    for (char c : value) {
      if (c < '0' || c > '9') return;
      ms = ms * 10 + (c - '0');
    }
    retry_ms_ = ms;
  } else {
    return;  // unknown field
  }
  any_field_ = true;
}

bool SseParser::HasPartialFrame() const {
  return !line_.empty() || any_field_ || (at_stream_start_ && bom_bytes_ > 0);
}

void SseParser::Reset() {
  at_stream_start_ = true;
  bom_bytes_ = 0;
  line_.clear();
  in_data_line_ = false;
  skip_lf_ = failed_ = any_field_ = has_id_ = has_data_ = false;
  id_.clear();
  event_.clear();
  data_.clear();
  retry_ms_.reset();
}

}  // namespace handoff::consumer
