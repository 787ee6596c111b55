// SseParser: an incremental Server-Sent Events (text/event-stream) frame parser.
//
// Bytes arrive in arbitrary chunks (a frame, a line, even a CRLF pair may be split across
// reads); complete frames come out in order. Lines end in CRLF, LF or CR; lines starting
// with ':' are comments; the fields are id, event, data (several data lines are joined
// with '\n') and retry (decimal milliseconds; other values ignored); unknown fields are
// ignored; a blank line dispatches the frame if it carried any known field. One UTF-8
// byte order mark at the very start of the stream (of a Reset()) is dropped, as the spec
// says; anywhere else it is an ordinary byte.
//
// Invariants: memory held is bounded by max_frame_bytes (a frame, or a line, that would
// exceed it is an error and the parser stays failed until Reset(), so an endless line
// cannot become an allocation storm); a frame is only ever emitted whole, so an
// incomplete trailing frame at end of stream is simply never emitted (call Reset() or
// drop the parser; HasPartialFrame() tells whether anything was discarded).
// Unlike a browser EventSource, `id` does not carry over to later frames: a frame
// without an id line has has_id == false (controls have none).
//
// A page is one data line of ~1 MB that arrives in many chunks: the value of a data line
// is appended to the frame's data as it arrives (not first gathered as a line), the data
// buffer keeps `data_slack` spare bytes of capacity (the JSON parser's padding, so that
// it parses in place), and GiveBack() lets the next frame reuse a parsed frame's buffer.
// A page's bytes are then copied once, from the socket's chunk into the frame.
//
// Thread-compatible.
#ifndef HANDOFF_CONSUMER_PROVIDER_SSE_PARSER_H_
#define HANDOFF_CONSUMER_PROVIDER_SSE_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace handoff::consumer {

struct SseFrame {
  std::string id;
  bool has_id = false;
  std::string event;  // empty when the frame had no event line (a page)
  std::string data;
  bool has_data = false;
  std::optional<int64_t> retry_ms;
};

class SseParser {
 public:
  using FrameCallback = std::function<void(SseFrame&& frame)>;

  // `data_slack`: spare capacity the frame's data always has beyond its size.
  explicit SseParser(size_t max_frame_bytes, size_t data_slack = 0);

  // Consumes `chunk`, calling `on_frame` for each frame it completes, in order. Returns
  // kResourceExhausted when a frame exceeds max_frame_bytes (nothing after that point is
  // parsed, and later calls return the same error until Reset()).
  absl::Status Feed(absl::string_view chunk, const FrameCallback& on_frame);

  // A frame's data buffer, done with: the next frame's data is written into it (its
  // capacity is kept). May be called from the frame callback.
  void GiveBack(std::string data);

  // Whether bytes of an unfinished frame are buffered.
  bool HasPartialFrame() const;

  // Forgets everything buffered (a new connection).
  void Reset();

 private:
  // `line` is one complete line without its terminator.
  void ProcessLine(absl::string_view line, const FrameCallback& on_frame);
  // Appends to the frame's data, keeping data_slack_ spare capacity.
  void AppendData(absl::string_view bytes);
  // One data line's value (or its start, for a streamed line) added to the frame.
  void AddDataValue(absl::string_view value);
  // When the unterminated line_ is a data line whose value has begun: moves the value
  // into the frame's data and continues the line there (in_data_line_).
  void MaybeStreamDataLine();
  size_t Retained() const { return id_.size() + event_.size() + data_.size(); }
  absl::Status Fail();

  const size_t max_frame_bytes_;
  const size_t data_slack_;
  bool at_stream_start_ = true;  // no byte of the stream consumed yet but a mark's
  size_t bom_bytes_ = 0;         // bytes of a leading byte order mark seen so far
  std::string line_;        // an unterminated line carried over from the previous chunk
  bool in_data_line_ = false;  // the unterminated line is a data line, going to data_
  bool skip_lf_ = false;    // the previous chunk ended in CR: a leading LF belongs to it
  bool failed_ = false;
  bool any_field_ = false;  // the current frame has at least one known field
  std::string id_;
  bool has_id_ = false;
  std::string event_;
  std::string data_;
  bool has_data_ = false;
  std::optional<int64_t> retry_ms_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PROVIDER_SSE_PARSER_H_
