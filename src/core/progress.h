// Progress of long work on stderr (bytes done, throughput, ETA), for people
// watching a terminal. Drawn only when stderr is a terminal (not TERM=dumb)
// and --quiet is off, so pipelines and logs never see it; plain text (no
// color, no escape sequences: the line is redrawn with "\r" and spaces).
//
// One process-wide reporter: a command opens a ProgressScope around its
// work, and any code under it, on any thread, calls progress_add() as bytes
// are done. The scope redraws one line from a background thread about four
// times a second and erases it when it ends. Log messages written while a
// line is drawn erase it first (see core/logging.cc), so they never mix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ckpt {

// Decides once, from main: progress is drawn when stderr is a terminal,
// TERM is not "dumb" and `quiet` is false.
void configure_progress(bool quiet);
// For tests and callers that know better (e.g. a terminal that is not stderr).
void set_progress_enabled(bool enabled);
bool progress_enabled();

// Adds bytes done to the open scope; a no-op when none is open. Thread-safe
// and cheap (one relaxed atomic add): call it per tensor or per slab.
void progress_add(uint64_t bytes);

// Shows progress of `total` bytes of work called `label` while it lives.
// Draws a first line at once and a last one (the final count) before
// erasing it, so even short work leaves its text in a terminal's stream.
// Only one scope draws at a time: a scope opened while another is open
// adds nothing and draws nothing (its bytes count toward the outer one).
class ProgressScope {
 public:
  ProgressScope(std::string label, uint64_t total_bytes);
  ~ProgressScope();
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  bool owner_ = false;
};

// Runs `write` (which writes whole lines to stderr) with the progress line
// erased and no redraw in between; the next tick draws it again below.
// The log sink calls this for every message.
void with_progress_line_erased(const std::function<void()>& write);

// The line drawn for `done` of `total` bytes after `elapsed_s` seconds, e.g.
// "diff  12.0 MiB / 48.0 MiB  25%  6.0 MiB/s  ETA 0:06". Throughput and ETA
// are "--" until some time has passed and some bytes are done; the ETA
// assumes the average throughput so far holds.
std::string format_progress_line(const std::string& label, uint64_t done, uint64_t total, double elapsed_s);
// "0:07", "3:05", "1:02:03"; "--" when negative or not finite.
std::string format_duration(double seconds);

}  // namespace ckpt
