// What a --part worker is asked to do and what it did, and the plan both
// --part drivers share: where every stored tensor's bytes
// go in the output (file, offset, size), found by running the writer
// against counting sinks, with a hash that makes receipts of another plan
// stale. exec/part_protocol.cc runs it for a local OUT (shares cut at
// tensor rows, written into shared files), exec/object_store_parts.cc for
// an s3:// OUT (shares cut at the multipart upload's part boundaries).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/parted_writer.h"
#include "io/part_sink.h"

namespace ckpt {

struct PartSpec {
  int index = 0;  // this worker, 0-based
  int count = 1;  // workers in all
  bool finalize_only = false;
  std::string from;    // where index/count came from, for the log: "--part", "Slurm (SLURM_PROCID/SLURM_NTASKS)", ...
  bool abort = false;  // give the output up: remove the parts (s3://: abort the shared uploads); last, so
                       // that {index, count, finalize_only, from} still initialises the rest
};

struct PartOutcome {
  bool published = false;   // this process finalized: OUT is in place
  std::string summary;      // what was done, for the success line
  std::size_t tensors = 0;  // pieces this worker wrote
  uint64_t bytes = 0;
  // What this process published when it finalized into a local OUT, in
  // Published::files' order (a sharded output's shards, then its index).
  std::vector<std::string> files;
};

}  // namespace ckpt

namespace ckpt::part_plan {

// Bytes [begin, end) of a unit, written by `owner`: the whole unit, or rows
// [r0, r1) of its tensor when the unit spans a boundary between two shares.
struct Piece {
  uint64_t begin = 0, end = 0;
  int64_t r0 = 0, r1 = 0;
  bool whole = true;
  int owner = 0;
};

// Where every unit's bytes go in the output (which file, at what offset),
// found by running the writer against counting sinks, and which worker
// writes which piece of it.
struct Layout {
  std::vector<std::string> names;  // per file
  std::vector<uint64_t> total;     // per file
  std::vector<std::size_t> file;   // per unit
  std::vector<uint64_t> offset, size;
  std::vector<int64_t> rows;               // dim 0 of the unit's tensor when it may be cut there, else 0
  std::vector<bool> zipped;                // a record of a zip archive: its receipt's CRC-32 goes into the output
  std::string hash;                        // of the plan and the source's files: receipts of another plan are stale
  std::vector<std::vector<Piece>> pieces;  // per unit, in byte order (assign_owners)

  std::size_t units() const { return size.size(); }
  PartSink::Ranges ranges_of(int part, std::size_t k) const {
    PartSink::Ranges r;
    for (std::size_t u = 0; u < units(); ++u)
      if (file[u] == k)
        for (const Piece& p : pieces[u])
          if (p.owner == part && p.end > p.begin) r.emplace_back(offset[u] + p.begin, offset[u] + p.end);
    std::sort(r.begin(), r.end());
    return r;
  }
  // Every byte of file k no unit holds: what the finalizing process writes.
  PartSink::Ranges metadata(std::size_t k) const {
    PartSink::Ranges units_in, out;
    for (std::size_t u = 0; u < units(); ++u)
      if (file[u] == k && size[u] > 0) units_in.emplace_back(offset[u], offset[u] + size[u]);
    std::sort(units_in.begin(), units_in.end());
    uint64_t at = 0;
    for (const auto& [b, e] : units_in) {
      if (b > at) out.emplace_back(at, b);
      at = std::max(at, e);
    }
    if (at < total.at(k)) out.emplace_back(at, total[k]);
    return out;
  }
};

// The plan of the writer's output (no tensor byte read).
Layout layout_of(PartedWriter& w, const PartedOptions& options);
// OUT.parts-<plan hash>: where the workers of a plan share their state.
std::string parts_dir(const std::string& output, const Layout& l);

}  // namespace ckpt::part_plan
