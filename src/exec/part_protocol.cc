#include "exec/part_protocol.h"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "exec/checksum.h"
#include "exec/object_store_parts.h"
#include "exec/part_layout.h"
#include "io/atomic_dir.h"
#include "io/byte_sink.h"
#include "io/part_sink.h"
#include "io/parts_folder.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "io/storage.h"
#include "model/ordered_json.h"
#include "plan/reshard.h"

namespace ckpt {
namespace fs = std::filesystem;
namespace {

// The job's request without what may differ between the workers and the
// finalizer and does not change the bytes (where each ran, --force,
// --no-fsync, --no-verify, threads, memory, device): a request.json changed
// after the parts were written is then another plan, and refused.
std::string request_fingerprint(const std::string& request) {
  nlohmann::ordered_json j;
  try {
    j = parse_checkpoint_json(request, "request.json");
  } catch (const Error&) {
    return request;
  }
  if (!j.is_object()) return request;
  j.erase("cwd");
  if (auto c = j.find("common"); c != j.end() && c->is_object())
    for (const char* key : {"force", "no_fsync", "no_verify", "threads", "memory_limit", "device"}) c->erase(key);
  return j.dump();
}

}  // namespace

namespace part_plan {

Layout layout_of(PartedWriter& w, const PartedOptions& options) {
  Layout l;
  l.names = w.file_names();
  std::vector<PartSink> counters;
  for (const auto& name : l.names) counters.emplace_back(-1, PartSink::Ranges{}, name);
  std::vector<ByteSink*> sinks;
  for (auto& c : counters) sinks.push_back(&c);
  Hasher h(ChecksumAlgorithm::kXxh3_64);
  auto add = [&](const std::string& text) {
    h.update(text.data(), text.size());
    h.update("\n", 1);
  };
  add(w.kind());
  for (const auto& d : w.destinations()) add(d);
  if (!options.request.empty()) add(request_fingerprint(options.request));
  w.run(sinks, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
    l.file.push_back(u.file);
    l.offset.push_back(sink.position());
    l.size.push_back(u.nbytes);
    bool cuttable = u.tensor && !u.tensor->shape.empty() && u.tensor->shape[0] > 1 && u.nbytes > 0;
    l.rows.push_back(cuttable ? u.tensor->shape[0] : 0);
    l.zipped.push_back(zip != nullptr);
    std::string what = u.tensor ? u.tensor->name + " " + std::string(dtype_name(u.tensor->output_dtype())) + " " +
                                      shape_str(u.tensor->shape)
                                : "bytes";
    add(std::to_string(u.file) + " " + std::to_string(sink.position()) + " " + std::to_string(u.nbytes) + " " + what);
    skip_unit(u, sink, zip);
  });
  for (std::size_t k = 0; k < counters.size(); ++k) {
    l.total.push_back(counters[k].position());
    add(l.names[k] + " " + std::to_string(l.total[k]));
  }
  for (const auto& f : options.inputs) {
    const EntryStat st = stat_path(f);
    if (st.kind != EntryKind::kNone)
      add(f + " " + std::to_string(st.size) + " " + std::to_string(st.mtime_ns / 1000000000) + "." +
          std::to_string(st.mtime_ns % 1000000000));
  }
  l.hash = h.hex_digest();
  return l;
}

std::string parts_dir(const std::string& output, const Layout& l) {
  return without_trailing_slashes(output) + ".parts-" + l.hash;
}

}  // namespace part_plan

namespace {

using part_plan::Layout;
using part_plan::layout_of;
using part_plan::parts_dir;
using part_plan::Piece;

// Which worker writes what when the output is split `parts` ways (the
// plan's hash does not depend on it: the parts folder is found first). By
// bytes, not tensor count: the unit bytes in output order are cut into
// `parts` equal shares; a unit that spans a cut is split at the dim-0 row
// nearest to it (one big tensor is written by several workers), and each
// piece goes to the share its middle byte falls in.
// A cut within 1/16 of a share of a unit's edge moves to that edge instead:
// a split unit costs its bytes once more (each piece's CRC-32 is read back,
// write_pieces), while the shares it evens out differ by at most 1/16.
// Without this, a boundary a few header bytes into a tensor cut it at row 1
// (24 equal tensors over 4 workers: three 83 MB read-backs, 1.16x the one
// process's time instead of 1.0x).
void assign_owners(Layout& l, int parts) {
  std::vector<std::size_t> order(l.units());
  for (std::size_t u = 0; u < order.size(); ++u) order[u] = u;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(l.file[a], l.offset[a]) < std::pair(l.file[b], l.offset[b]);
  });
  long double all = 0;
  for (uint64_t n : l.size) all += static_cast<long double>(n);
  auto share_of = [&](long double at) {
    int part = all == 0 ? 0 : static_cast<int>(at * parts / all);
    return std::clamp(part, 0, parts - 1);
  };
  l.pieces.assign(l.units(), {});
  long double before = 0;
  for (std::size_t u : order) {
    const auto size = static_cast<long double>(l.size[u]);
    std::vector<int64_t> cuts = {0};
    if (l.rows[u] > 1) {
      long double row = size / static_cast<long double>(l.rows[u]);
      const long double snap = all / parts / 16;
      for (int p = 1; p < parts; ++p) {
        long double boundary = all * p / parts;
        if (boundary - before <= snap || before + size - boundary <= snap) continue;
        auto r = static_cast<int64_t>(std::llround((boundary - before) / row));
        if (r > cuts.back() && r < l.rows[u]) cuts.push_back(r);
      }
    }
    if (cuts.size() == 1) {
      Piece p;
      p.end = l.size[u];
      p.owner = share_of(before + size / 2);
      l.pieces[u].push_back(p);
    } else {
      cuts.push_back(l.rows[u]);
      uint64_t row_bytes = l.size[u] / static_cast<uint64_t>(l.rows[u]);
      for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
        Piece p;
        p.whole = false;
        p.r0 = cuts[c];
        p.r1 = cuts[c + 1];
        p.begin = static_cast<uint64_t>(p.r0) * row_bytes;
        p.end = static_cast<uint64_t>(p.r1) * row_bytes;
        p.owner = share_of(before + static_cast<long double>(p.begin + p.end) / 2);
        l.pieces[u].push_back(p);
      }
    }
    before += size;
  }
}

std::string data_file(const std::string& dir, std::size_t k) { return dir + "/data-" + std::to_string(k); }

std::string receipt_name(int part, int parts) {
  return "part-" + std::to_string(part) + "-of-" + std::to_string(parts) + ".json";
}

struct Written {
  uint64_t end = 0;
  uint32_t crc = 0;
};

struct Receipt {
  std::string file;
  std::string plan;
  int part = -1, parts = 0;
  std::map<std::pair<std::size_t, uint64_t>, Written> pieces;  // (unit, begin) -> end, CRC-32 of the bytes
};

std::vector<Receipt> read_receipts(const PartsFolder& folder) {
  std::vector<Receipt> out;
  for (const DirEntry& entry : list_directory(folder.path())) {
    const std::string& name = entry.name;
    if (!name.starts_with("part-") || !name.ends_with(".json")) continue;
    Receipt r;
    r.file = folder.path_of(name);
    std::optional<std::string> text = folder.read_file(name);  // Unsafe when it is a link
    if (!text) continue;                                       // the finalizing worker removed the folder meanwhile
    try {
      nlohmann::ordered_json j = parse_checkpoint_json(*text, r.file);
      r.plan = j.at("plan").get<std::string>();
      r.part = j.at("part").get<int>();
      r.parts = j.at("parts").get<int>();
      for (const auto& p : j.at("pieces"))
        r.pieces[{p.at(0).get<std::size_t>(), p.at(1).get<uint64_t>()}] = {p.at(2).get<uint64_t>(),
                                                                           p.at(3).get<uint32_t>()};
    } catch (const std::exception& e) {
      if (!path_exists(r.file)) continue;  // the finalizing worker removed the folder meanwhile
      fail(ErrorCode::kDataLoss,
           r.file + ": not a receipt ckptconv wrote (" + e.what() + "): remove it and rerun its part");
    }
    out.push_back(std::move(r));
  }
  return out;
}

// The shared files of the parts folder, open for the duration of one pass.
class DataFiles : public PartsFiles {
 public:
  DataFiles(const PartsFolder& folder, std::size_t n, bool create)
      : PartsFiles(folder, names(n), create, ": a shared output file of the parts is missing: rerun every part") {}

 private:
  static std::vector<std::string> names(std::size_t n) {
    std::vector<std::string> out;
    for (std::size_t k = 0; k < n; ++k) out.push_back("data-" + std::to_string(k));
    return out;
  }
};

// CRC-32 of bytes [at, at + n) of a file this process just wrote (from the
// page cache): a piece of a zip record, whose CRC the finalizer joins with
// the other pieces'.
uint32_t crc_of_range(const DataFiles& files, std::size_t k, uint64_t at, uint64_t n) {
  std::vector<char> buf(static_cast<std::size_t>(std::min<uint64_t>(n, 4u << 20)));
  uint32_t crc = 0;
  while (n > 0) {
    auto step = static_cast<std::size_t>(std::min<uint64_t>(n, buf.size()));
    std::size_t got = files.read_at(k, at, buf.data(), step, "cannot read back a written piece");
    if (got == 0)
      fail(ErrorCode::kOutputFailed, files.path(k) + ": cannot read back a written piece: the file ends before it");
    crc = archive::crc32_update(crc, buf.data(), got);
    at += got;
    n -= got;
  }
  return crc;
}

// A receipt's CRC-32 of a zip record's piece goes into the output's headers
// unread, so a forged one would publish an archive whose CRCs lie
// (torch.load does not check them). This is one read of every written byte
// by one process, from the disk (the workers' written pages are dropped
// from the cache as they go): on one node it made a 2-way --part run 1.75x
// the one-process time, and over N nodes it bounds the run by one node's
// read bandwidth. So it runs only on the recovery path after a crash,
// `ckptconv finalize OUT` and `--part finalize` (--no-verify skips it there
// too). The worker that completes the set
// trusts them: the folder and every receipt are this user's (PartsFolder
// checks owner, link count, no symbolic link), so whoever could alter a
// receipt could alter the bytes it vouches for, and a stale receipt of the
// same plan vouches for the same bytes (the plan fixes every byte).
void verify_pieces(const Layout& l, const std::map<int, const Receipt*>& by_part, const DataFiles& files) {
  for (std::size_t u = 0; u < l.units(); ++u) {
    if (!l.zipped[u]) continue;
    for (const Piece& p : l.pieces[u]) {
      const Receipt& r = *by_part.at(p.owner);
      const Written& w = r.pieces.at({u, p.begin});
      const std::size_t k = l.file[u];
      uint32_t crc = crc_of_range(files, k, l.offset[u] + p.begin, p.end - p.begin);
      if (crc != w.crc)
        fail(ErrorCode::kDataLoss, r.file + ": the CRC-32 it gives for bytes " + std::to_string(p.begin) + ".." +
                                       std::to_string(p.end) + " of item " + std::to_string(u) + " of " + l.names[k] +
                                       " is not that of the bytes in " + files.path(k) + ": rerun part " +
                                       std::to_string(r.part) + "; nothing was published");
    }
  }
}

// The record a finalize leaves in the parts folder once the weights are
// published, before what goes beside them (options.publish_beside: an HF
// folder's side files, config.json last) and before the folder is removed:
// a finalize stopped between the two (a kill, a failed copy) is resumed by
// the next one from it, since the data files it would publish again are
// gone (renamed into place).
constexpr const char* kPublishedRecord = "published.json";

void record_published(const PartsFolder& folder, const Layout& l, const Published& done) {
  folder.replace_file(kPublishedRecord,
                      nlohmann::json{{"plan", l.hash}, {"files", done.files}, {"what", done.what}}.dump());
}

// What an earlier finalize of this plan published (its record), each file
// still there; nullopt when it published nothing.
std::optional<Published> published_before(const PartsFolder& folder, const Layout& l) {
  std::optional<std::string> text = folder.read_file(kPublishedRecord);
  if (!text) return std::nullopt;
  const std::string file = folder.path_of(kPublishedRecord);
  Published done;
  try {
    nlohmann::ordered_json j = parse_checkpoint_json(*text, file);
    if (j.at("plan").get<std::string>() != l.hash)
      fail(ErrorCode::kDataLoss,
           file + ": the record of another plan: remove " + folder.path() + " and rerun every part");
    done.files = j.at("files").get<std::vector<std::string>>();
    done.what = j.at("what").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kDataLoss, file + ": not a record ckptconv wrote (" + e.what() + ")");
  }
  for (const auto& f : done.files)
    if (!stat_path(f).is_file())
      fail(ErrorCode::kDataLoss, file + ": says " + f + " was published, which is not there: remove " + folder.path() +
                                     " and rerun every part");
  return done;
}

// What goes beside the published output, then the parts folder removed:
// the last steps of a finalize, the first of one resumed.
void finish_publishing(const PartedOptions& options, const PartsFolder& folder, const Published& done) {
  stop_here_for_tests("finalize-published");
  if (options.publish_beside) options.publish_beside(done.files);
  storage_for(folder.path()).remove_tree(folder.path());
}

// Checks the receipts against the plan (and, when `verify_receipts`, their
// CRC-32s against the written bytes: verify_pieces), writes every byte no
// unit holds with the units' CRC-32s (pieces joined), then publishes.
std::string finalize(PartedWriter& w, const PartedOptions& options, const Layout& l, int parts,
                     const PartsFolder& folder, bool verify_receipts, std::vector<std::string>& published) {
  const std::string& dir = folder.path();
  if (std::optional<Published> before = published_before(folder, l)) {
    spdlog::info("{} was published by a finalize that stopped before what goes beside it; finishing that",
                 options.path);
    finish_publishing(options, folder, *before);
    published = before->files;
    return "finalized " + std::to_string(parts) + " parts (" + before->what + ", published before)";
  }
  std::vector<Receipt> receipts = read_receipts(folder);
  std::map<int, const Receipt*> by_part;
  for (const auto& r : receipts) {
    if (r.plan != l.hash)
      fail(ErrorCode::kDataLoss, r.file + ": a receipt of another plan (" + r.plan + ", this one is " + l.hash +
                                     "): the source or options changed; remove " + dir + " and rerun every part");
    if (r.parts != parts)
      fail(ErrorCode::kDataLoss, r.file + ": a receipt of a run split " + std::to_string(r.parts) + " ways, this one " +
                                     std::to_string(parts) + ": remove " + dir + " and rerun every part");
    by_part[r.part] = &r;
  }
  std::string missing;
  for (int p = 0; p < parts; ++p)
    if (!by_part.count(p)) missing += (missing.empty() ? "" : ", ") + std::to_string(p) + "/" + std::to_string(parts);
  if (!missing.empty())
    fail(ErrorCode::kDataLoss, options.path + ": parts " + missing + " have no receipt in " + dir +
                                   ": rerun them (--part I/N), then finalize; nothing was written at " + options.path);
  std::vector<uint32_t> crc(l.units(), 0);
  std::size_t expected = 0;
  for (std::size_t u = 0; u < l.units(); ++u) {
    bool first = true;
    for (const Piece& p : l.pieces[u]) {
      const Receipt& r = *by_part.at(p.owner);
      auto it = r.pieces.find({u, p.begin});
      if (it == r.pieces.end() || it->second.end != p.end)
        fail(ErrorCode::kDataLoss, r.file + ": does not cover bytes " + std::to_string(p.begin) + ".." +
                                       std::to_string(p.end) + " of item " + std::to_string(u) + " of " +
                                       l.names[l.file[u]] + ", which its part owns: rerun part " +
                                       std::to_string(r.part));
      crc[u] = first ? it->second.crc : archive::crc32_combine(crc[u], it->second.crc, p.end - p.begin);
      first = false;
      ++expected;
    }
  }
  std::size_t named = 0;
  for (const auto& r : receipts) named += r.pieces.size();
  if (named != expected)  // each owned piece was found above; anything more is not this plan's
    fail(ErrorCode::kDataLoss,
         dir + ": receipts name pieces their parts do not own: remove " + dir + " and rerun every part");
  if (!options.force) refuse_existing(w);
  {
    DataFiles files(folder, l.names.size(), false);
    if (verify_receipts && options.copy.verify) verify_pieces(l, by_part, files);
    std::vector<PartSink> sinks;
    for (std::size_t k = 0; k < files.size(); ++k) sinks.emplace_back(files.fd(k), l.metadata(k), l.names[k]);
    std::vector<ByteSink*> out;
    for (auto& s : sinks) out.push_back(&s);
    std::size_t seq = 0;
    w.run(out, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
      if (seq >= l.units() || l.size[seq] != u.nbytes)
        fail(ErrorCode::kInternal, "finalize emitted a different layout than planned");
      skip_unit(u, sink, zip, crc[seq++]);
    });
    for (std::size_t k = 0; k < files.size(); ++k) {
      if (sinks[k].position() != l.total[k])
        fail(ErrorCode::kInternal, "finalize wrote a different layout than planned");
      files.set_length(k, l.total[k], options.durable);
    }
  }
  check_interrupted();
  Published done = w.publish([&](std::size_t k) { return data_file(dir, k); }, options.force, options.durable);
  record_published(folder, l, done);
  finish_publishing(options, folder, done);
  published = done.files;
  return "finalized " + std::to_string(parts) + " parts (" + done.what + ")";
}

// This worker's pieces into the shared files.
nlohmann::json write_pieces(PartedWriter& w, const PartedOptions& options, const PartSpec& part, const Layout& l,
                            const PartsFolder& folder, uint64_t& bytes) {
  nlohmann::json written = nlohmann::json::array();
  DataFiles files(folder, l.names.size(), true);
  std::vector<PartSink> sinks;
  for (std::size_t k = 0; k < files.size(); ++k)
    sinks.emplace_back(files.fd(k), l.ranges_of(part.index, k), l.names[k], 0, options.durable);
  std::vector<ByteSink*> out;
  for (auto& s : sinks) out.push_back(&s);
  std::size_t seq = 0;
  w.run(out, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
    const std::size_t unit = seq++;
    const std::vector<Piece>& pieces = l.pieces.at(unit);
    if (pieces.size() == 1 && pieces[0].owner == part.index) {  // the whole unit
      write_unit(u, sink, zip, options.copy);
      written.push_back({unit, 0, u.nbytes, zip ? zip->record_crc() : 0u});
      bytes += u.nbytes;
      return;
    }
    const uint64_t at = sink.position();
    skip_unit(u, sink, zip);
    for (const Piece& p : pieces) {
      if (p.owner != part.index) continue;
      if (p.whole || !u.tensor) fail(ErrorCode::kInternal, "a piece of a unit that cannot be cut");
      // Not streamed: its CRC-32 is read back from the page cache just below.
      PartSink piece(files.fd(u.file), {{at + p.begin, at + p.end}}, l.names[u.file], at + p.begin);
      append_tensor(rows_tensor(*u.tensor, p.r0, p.r1), piece, options.copy);
      uint32_t crc = zip ? crc_of_range(files, u.file, at + p.begin, p.end - p.begin) : 0;
      written.push_back({unit, p.begin, p.end, crc});
      bytes += p.end - p.begin;
    }
  });
  if (seq != l.units()) fail(ErrorCode::kInternal, "a part emitted a different layout than planned");
  if (options.copy.verify) options.copy.verify->check_deferred();  // before the receipt vouches for the bytes
  // Only this worker's ranges, written and waited for: an fdatasync here
  // flushed the whole shared file, the other workers' bytes still being
  // written included, and committed the journal once more per worker. The
  // receipt's own fsync just below commits the journal and flushes the
  // device's cache after these writes completed (ext4, XFS: one log per
  // file system), and the finalizer fsyncs every file before it publishes
  // (set_length), which is the promise docs/safety.md makes; the recovery
  // path re-reads every piece against its receipt besides.
  if (options.durable)
    for (std::size_t k = 0; k < files.size(); ++k) files.write_back(k, l.ranges_of(part.index, k));
  return written;
}

// This worker's bytes and receipt, and the finalization when its receipt
// completes the set.
PartOutcome write_part(PartedWriter& w, const PartedOptions& options, const PartSpec& part, const Layout& l,
                       const PartsFolder& folder) {
  const std::string& dir = folder.path();
  if (!options.request.empty() && !path_exists(folder.path_of("request.json"))) {
    // Every worker may get here at once, with the same text: each writes its
    // own file and renames it over the name (one atomic replace).
    folder.replace_file("request.json", options.request);
  }
  uint64_t bytes = 0;
  nlohmann::json pieces = write_pieces(w, options, part, l, folder, bytes);
  check_interrupted();
  nlohmann::json receipt = {
      {"plan", l.hash}, {"part", part.index}, {"parts", part.count}, {"output", options.path}, {"pieces", pieces}};
  auto sink = AtomicFileSink::create(dir + "/" + receipt_name(part.index, part.count), true, options.durable);
  sink->write(receipt.dump());
  sink->finish();
  PartOutcome outcome;
  outcome.tensors = pieces.size();
  outcome.bytes = bytes;
  outcome.summary = "wrote part " + std::to_string(part.index) + "/" + std::to_string(part.count) + " (" +
                    std::to_string(pieces.size()) + " pieces, " + std::to_string(bytes) + " bytes) into " + dir;
  // The worker whose receipt completes the set finalizes; an exclusive
  // create elects one when several complete it at once.
  std::map<int, bool> done;
  for (const auto& r : read_receipts(folder))
    if (r.plan == l.hash && r.parts == part.count) done[r.part] = true;
  if (static_cast<int>(done.size()) < part.count) {
    if (!is_directory(dir))  // another worker completed the set at the same time, and finalized
      outcome.summary += "; another worker finalized " + options.path;
    else
      outcome.summary += "; " + std::to_string(done.size()) + " of " + std::to_string(part.count) + " parts done";
    return outcome;
  }
  if (!folder.create_exclusive("finalizing")) {
    if (errno == ENOENT)  // the folder is gone: that worker is done
      outcome.summary += "; another worker finalized " + options.path;
    else
      outcome.summary += "; another worker is finalizing (if it died, run: ckptconv finalize " + options.path + ")";
    return outcome;
  }
  try {
    outcome.summary +=
        "; " + finalize(w, options, l, part.count, folder, false, outcome.files) + " into " + options.path;
  } catch (...) {
    folder.remove_file("finalizing");  // a rerun may try again
    throw;
  }
  outcome.published = true;
  return outcome;
}

}  // namespace

PartSpec parse_part(const std::string& text) {
  PartSpec p;
  if (text == "finalize") {
    p.finalize_only = true;
    p.from = "--part finalize";
    return p;
  }
  if (text == "abort") {
    p.abort = true;
    p.from = "--part abort";
    return p;
  }
  auto both = [&](const char* rank, const char* size, const char* who) -> bool {
    const char* r = std::getenv(rank);
    const char* s = std::getenv(size);
    if (!r || !s || !*r || !*s) return false;
    p.index = std::atoi(r);
    p.count = std::atoi(s);
    p.from = std::string(who) + " (" + rank + "/" + size + ")";
    return true;
  };
  if (text == "auto") {
    if (!both("SLURM_PROCID", "SLURM_NTASKS", "Slurm") &&
        !both("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI") && !both("PMI_RANK", "PMI_SIZE", "PMI") &&
        !both("RANK", "WORLD_SIZE", "torchrun"))
      fail_invalid(
          "--part auto: no launcher's environment found (SLURM_PROCID/SLURM_NTASKS, "
          "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, RANK/WORLD_SIZE); give --part I/N");
  } else {
    auto slash = text.find('/');
    bool digits = slash != std::string::npos && slash > 0 && slash + 1 < text.size() &&
                  text.find_first_not_of("0123456789/") == std::string::npos &&
                  text.find('/', slash + 1) == std::string::npos;
    if (!digits || slash > 6 || text.size() - slash - 1 > 6)
      fail_invalid("--part must be I/N (worker I of N, 0-based), auto, finalize or abort, not '" + text + "'");
    p.index = std::atoi(text.substr(0, slash).c_str());
    p.count = std::atoi(text.substr(slash + 1).c_str());
    p.from = "--part";
  }
  if (p.count < 1 || p.index < 0 || p.index >= p.count)
    fail_invalid("--part " + text + " (" + p.from + "): worker " + std::to_string(p.index) + " of " +
                 std::to_string(p.count) + " is not one of 0.." + std::to_string(std::max(0, p.count - 1)));
  return p;
}

PartOutcome write_parted(PartedWriter& w, const PartedOptions& options, const PartSpec& part) {
  if (is_s3_url(options.path)) {
    if (!w.publishes_to_object_store())
      fail(ErrorCode::kOutputFailed, options.path + ": writing a " + w.kind() +
                                         " output to s3:// is not supported yet: write it locally and upload it "
                                         "(docs/object-storage.md)");
    return write_parted_to_object_store(w, options, part, layout_of(w, options));
  }
  if (part.abort) {
    const std::string dir = parts_dir(options.path, layout_of(w, options));
    if (!PartsFolder::open(dir)) return {false, "no parts of this plan to remove (no " + dir + ")", 0, 0, {}};
    storage_for(dir).remove_tree(dir);
    return {false, "removed " + dir, 0, 0, {}};
  }
  if (part.finalize_only) {
    // The folder's name does not depend on the number of parts; the
    // receipts in it say what it was.
    Layout l = layout_of(w, options);
    std::string dir = parts_dir(options.path, l);
    std::optional<PartsFolder> folder = PartsFolder::open(dir);
    std::vector<Receipt> receipts;
    if (folder) receipts = read_receipts(*folder);
    if (receipts.empty())
      fail(ErrorCode::kDataLoss, options.path + ": no part of this plan has been written (no receipt in " + dir +
                                     "): run the parts first, with the same source and options");
    if (path_exists(dir + "/finalizing"))
      spdlog::info("a worker had begun finalizing {} and did not finish; finishing it", options.path);
    int parts = receipts.front().parts;
    assign_owners(l, parts);
    PartOutcome outcome;
    outcome.published = true;
    outcome.summary = finalize(w, options, l, parts, *folder, true, outcome.files);
    return outcome;
  }
  if (!options.force) refuse_existing(w);  // before any work, as without --part
  Layout l = layout_of(w, options);
  assign_owners(l, part.count);
  std::string dir = parts_dir(options.path, l);
  PartsFolder folder = PartsFolder::create(dir);
  try {
    return write_part(w, options, part, l, folder);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInterrupted) throw;
    fail(ErrorCode::kInterrupted, "nothing was written at " + options.path + "; " + dir +
                                      " keeps the other parts' bytes and receipts, and this part has no receipt: "
                                      "rerun it (--part " +
                                      std::to_string(part.index) + "/" + std::to_string(part.count) + ")");
  }
}

std::vector<std::string> parts_folders(const std::string& output) {
  fs::path out(without_trailing_slashes(output));
  fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  std::string prefix = out.filename().string() + ".parts-";
  std::vector<std::string> found;
  for (const DirEntry& entry : list_directory(parent.string())) {
    // A link is listed too: opening it then refuses it (io/parts_folder.h).
    if (entry.name.starts_with(prefix) && (entry.is_directory() || entry.link))
      found.push_back((out.parent_path() / entry.name).string());
  }  // sorted: list_directory lists names in order
  return found;
}

std::optional<std::string> stored_request(const std::string& folder) {
  if (is_s3_url(folder)) return s3_get_object(folder + "/request.json");  // the state prefix of an s3:// OUT
  std::optional<PartsFolder> parts = PartsFolder::open(folder);
  if (!parts) return std::nullopt;
  return parts->read_file("request.json");
}

}  // namespace ckpt
