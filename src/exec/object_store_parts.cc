#include "exec/object_store_parts.h"

#include <spdlog/spdlog.h>

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "exec/object_store_publish.h"
#include "io/s3_storage.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"
#include "model/ordered_json.h"
#include "plan/reshard.h"

namespace ckpt {
namespace {

using part_plan::Layout;

// Part `number` of a file: its bytes [begin, end), the worker that uploads
// them, and whether they go up through the finalizer (a stash).
struct GridPart {
  uint64_t number = 0;  // S3's, from 1
  uint64_t begin = 0, end = 0;
  int owner = 0;
  bool stashed = false;
};

// Every file of the output cut into its upload's parts.
struct Grid {
  std::vector<uint64_t> part_size;           // per file
  std::vector<std::vector<GridPart>> files;  // per file, in order

  const GridPart& at(std::size_t k, uint64_t offset) const {
    const auto& parts = files[k];
    return parts[std::min<std::size_t>(offset / part_size[k], parts.size() - 1)];
  }
  GridPart& at(std::size_t k, uint64_t offset) {
    return const_cast<GridPart&>(static_cast<const Grid&>(*this).at(k, offset));
  }
  // The worker whose parts hold every byte of `unit`; -1 when several do
  // (a worker's parts are consecutive, so its first and last byte tell).
  int sole_owner(const Layout& l, std::size_t u) const {
    const int first = at(l.file[u], l.offset[u]).owner;
    return first == at(l.file[u], l.offset[u] + l.size[u] - 1).owner ? first : -1;
  }
  // The parts of file k that worker `w` uploads.
  std::vector<GridPart> owned(int w, std::size_t k) const {
    std::vector<GridPart> out;
    for (const auto& p : files[k])
      if (p.owner == w) out.push_back(p);
    return out;
  }
};

// Marks the parts whose metadata bytes depend on a CRC-32 their worker
// does not know: the bytes after a zip record (its data descriptor, and in
// a DCP item the item's central directory) when the record is not all in
// that worker's parts, and a file's tail after its last record (a .pt's
// central directory names every record's CRC-32) unless all the file's
// records are.
void mark_stashed(const Layout& l, Grid& g) {
  for (std::size_t k = 0; k < g.files.size(); ++k) {
    std::vector<std::size_t> units;
    for (std::size_t u = 0; u < l.units(); ++u)
      if (l.file[u] == k && l.size[u] > 0) units.push_back(u);
    std::sort(units.begin(), units.end(), [&](std::size_t a, std::size_t b) { return l.offset[a] < l.offset[b]; });
    auto mark = [&](uint64_t begin, uint64_t end, const std::vector<std::size_t>& deps) {
      if (begin >= end || deps.empty()) return;
      for (uint64_t at = begin / g.part_size[k] * g.part_size[k]; at < end; at += g.part_size[k]) {
        GridPart& p = g.at(k, at);
        for (std::size_t u : deps)
          if (g.sole_owner(l, u) != p.owner) p.stashed = true;
      }
    };
    std::vector<std::size_t> zipped;
    for (std::size_t i = 0; i < units.size(); ++i) {
      const std::size_t u = units[i];
      if (!l.zipped[u]) continue;
      zipped.push_back(u);
      if (i + 1 < units.size()) mark(l.offset[u] + l.size[u], l.offset[units[i + 1]], {u});
    }
    if (!units.empty()) mark(l.offset[units.back()] + l.size[units.back()], l.total[k], zipped);
  }
}

// The parts of every file; part n of a file goes to the worker whose equal
// share of all the output's bytes (the files one after another) holds the
// part's middle byte.
Grid grid_of(const Layout& l, int workers) {
  Grid g;
  long double all = 0;
  for (uint64_t t : l.total) all += static_cast<long double>(t);
  long double before = 0;
  for (std::size_t k = 0; k < l.names.size(); ++k) {
    const uint64_t total = l.total[k];
    g.part_size.push_back(s3_part_size(total));
    std::vector<GridPart> parts;
    uint64_t at = 0;
    do {  // an empty file is one empty part
      GridPart p;
      p.number = parts.size() + 1;
      p.begin = at;
      p.end = std::min(total, at + g.part_size[k]);
      const long double middle = before + static_cast<long double>(p.begin + p.end) / 2;
      p.owner = all == 0 ? 0 : std::clamp(static_cast<int>(middle * workers / all), 0, workers - 1);
      parts.push_back(p);
      at = p.end;
    } while (at < total);
    before += static_cast<long double>(total);
    g.files.push_back(std::move(parts));
  }
  mark_stashed(l, g);
  return g;
}

std::string stash_name(std::size_t k, uint64_t number) {
  return "stash-" + std::to_string(k) + "-" + std::to_string(number);
}

std::string receipt_name(int part, int parts) {
  return "part-" + std::to_string(part) + "-of-" + std::to_string(parts) + ".json";
}

// The upload of each file that every worker sends its parts to: made by
// the first worker to publish uploads.json; one that loses the race aborts
// the uploads it began.
std::vector<std::string> shared_uploads(const PartedWriter& w, const Layout& l, const std::string& state) {
  const std::string url = state + "/uploads.json";
  auto parse = [&](const std::string& text) {
    std::vector<std::string> ids;
    try {
      nlohmann::ordered_json j = parse_checkpoint_json(text, url);
      if (j.at("plan").get<std::string>() == l.hash) ids = j.at("uploads").get<std::vector<std::string>>();
    } catch (const std::exception& e) {
      fail(ErrorCode::kDataLoss, url + ": not the state ckptconv wrote (" + e.what() + "): run --part abort");
    }
    if (ids.size() != l.names.size())
      fail(ErrorCode::kDataLoss, url + ": the uploads of another plan: run --part abort, then every part");
    return ids;
  };
  if (auto text = s3_get_object(url)) return parse(*text);
  std::vector<std::string> ids;
  try {
    for (std::size_t k = 0; k < l.names.size(); ++k) ids.push_back(s3_create_upload(w.output_path(k)));
    if (s3_put_new_object(url, nlohmann::ordered_json{{"plan", l.hash}, {"uploads", ids}}.dump())) return ids;
  } catch (...) {
    for (std::size_t k = 0; k < ids.size(); ++k) s3_abort_upload(w.output_path(k), ids[k]);
    throw;
  }
  for (std::size_t k = 0; k < ids.size(); ++k) s3_abort_upload(w.output_path(k), ids[k]);
  auto text = s3_get_object(url);
  if (!text) fail(ErrorCode::kOutputFailed, url + ": another worker made it and it is gone: rerun this part");
  return parse(*text);
}

// The parts of one file that this worker uploads, filled from the writer's
// stream (headers, whole tensors) and at their place (the rows of a tensor
// its share holds a piece of). A part goes up as soon as its last byte is
// in, so a worker holds at most a part or two per file.
class PartUploads final : public ByteSink {
 public:
  PartUploads(std::string url, std::string upload_id, std::string state, std::size_t k, uint64_t part_size,
              std::vector<GridPart> mine)
      : url_(std::move(url)),
        id_(std::move(upload_id)),
        state_(std::move(state)),
        k_(k),
        part_size_(part_size),
        mine_(std::move(mine)),
        buffers_(mine_.size()),
        filled_(mine_.size(), 0),
        sent_(mine_.size(), false) {}
  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    put(position_, data, n);
    position_ += n;
  }
  uint64_t position() const override { return position_; }
  void skip(uint64_t n) override { position_ += n; }
  // Bytes [first(), last()) of the file are this worker's.
  uint64_t first() const { return mine_.empty() ? 0 : mine_.front().begin; }
  uint64_t last() const { return mine_.empty() ? 0 : mine_.back().end; }
  // n bytes at `at` of the file; those outside this worker's parts dropped.
  void put(uint64_t at, const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    // The parts are consecutive, of part_size_ bytes but the file's last.
    for (uint64_t lo = std::max(at, first()), hi = std::min(at + n, last()); lo < hi;) {
      const auto i = static_cast<std::size_t>((lo - first()) / part_size_);
      const GridPart& g = mine_[i];
      const uint64_t end = std::min(hi, g.end);
      if (sent_[i])
        fail(ErrorCode::kInternal, url_ + ": part " + std::to_string(g.number) + " written after it was sent");
      if (buffers_[i].empty()) buffers_[i].resize(g.end - g.begin);
      std::memcpy(buffers_[i].data() + (lo - g.begin), p + (lo - at), end - lo);
      filled_[i] += end - lo;
      if (filled_[i] > g.end - g.begin) fail(ErrorCode::kInternal, url_ + ": part bytes written twice");
      if (filled_[i] == g.end - g.begin) send(i);
      lo = end;
    }
  }
  // Every part sent (an empty file's empty part too).
  void finish() {
    for (std::size_t i = 0; i < mine_.size(); ++i) {
      if (sent_[i]) continue;
      if (mine_[i].end > mine_[i].begin)
        fail(ErrorCode::kInternal, url_ + ": part " + std::to_string(mine_[i].number) + " was not filled (" +
                                       std::to_string(filled_[i]) + " bytes)");
      send(i);
    }
  }
  // For the receipt: [k, number, ETag] of each part sent, [k, number] of each stash.
  void report(nlohmann::json& uploaded, nlohmann::json& stashed) const {
    for (const auto& [number, etag] : etags_) uploaded.push_back({k_, number, etag});
    for (uint64_t number : stashes_) stashed.push_back({k_, number});
  }

 private:
  void send(std::size_t i) {
    check_interrupted();
    const GridPart& g = mine_[i];
    if (g.stashed) {
      s3_put_object(state_ + "/" + stash_name(k_, g.number), std::string(buffers_[i].begin(), buffers_[i].end()), true);
      stashes_.push_back(g.number);
    } else {
      etags_[g.number] = s3_upload_part(url_, id_, g.number, buffers_[i].data(), buffers_[i].size());
    }
    std::vector<char>().swap(buffers_[i]);
    sent_[i] = true;
  }

  std::string url_, id_, state_;
  std::size_t k_;
  uint64_t part_size_;
  std::vector<GridPart> mine_;
  std::vector<std::vector<char>> buffers_;
  std::vector<uint64_t> filled_;
  std::vector<bool> sent_;
  std::map<uint64_t, std::string> etags_;
  std::vector<uint64_t> stashes_;
  uint64_t position_ = 0;
};

// A tensor's rows written from byte `start` of the file: the bytes in
// [keep_begin, keep_end) go to the parts, the rest (of the rows at either
// end that the share holds only some of) are dropped. Sums the CRC-32 of
// the bytes kept.
class Clip final : public ByteSink {
 public:
  Clip(PartUploads& to, uint64_t start, uint64_t keep_begin, uint64_t keep_end)
      : to_(to), at_(start), begin_(keep_begin), end_(keep_end) {}
  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    const uint64_t lo = std::max(at_, begin_), hi = std::min(at_ + n, end_);
    if (lo < hi) {
      const char* p = static_cast<const char*>(data) + (lo - at_);
      to_.put(lo, p, hi - lo);
      crc_ = archive::crc32_update(crc_, p, hi - lo);
    }
    at_ += n;
  }
  uint64_t position() const override { return at_; }
  uint32_t crc() const { return crc_; }

 private:
  PartUploads& to_;
  uint64_t at_, begin_, end_;
  uint32_t crc_ = 0;
};

// This worker's parts of every file, sent; its receipt's lists.
nlohmann::json write_share(PartedWriter& w, const PartedOptions& options, const PartSpec& part, const Layout& l,
                           const Grid& g, const std::vector<std::string>& ids, const std::string& state,
                           uint64_t& bytes) {
  std::vector<std::unique_ptr<PartUploads>> files;
  std::vector<ByteSink*> sinks;
  for (std::size_t k = 0; k < l.names.size(); ++k) {
    files.push_back(
        std::make_unique<PartUploads>(w.output_path(k), ids[k], state, k, g.part_size[k], g.owned(part.index, k)));
    sinks.push_back(files.back().get());
  }
  nlohmann::json pieces = nlohmann::json::array();
  std::size_t seq = 0;
  w.run(sinks, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
    const std::size_t unit = seq++;
    PartUploads& f = *files.at(u.file);
    const uint64_t at = sink.position();
    const uint64_t b = std::max(at, f.first()), e = std::min(at + u.nbytes, f.last());
    if (b >= e) {  // none of its bytes are in this worker's parts
      skip_unit(u, sink, zip);
      return;
    }
    if (b == at && e == at + u.nbytes) {  // all of them
      write_unit(u, sink, zip, options.copy);
      if (zip) pieces.push_back({unit, 0, u.nbytes, zip->record_crc()});
      bytes += u.nbytes;
      return;
    }
    // A share of it: the rows that cover the share (a tensor that cannot be
    // cut, or raw bytes, whole), its bytes outside the share dropped. The
    // descriptor skip_unit writes lands in a stashed part (mark_stashed).
    skip_unit(u, sink, zip);
    int64_t r0 = 0, r1 = l.rows.at(unit);
    uint64_t row = 0;
    if (r1 > 1) {
      row = u.nbytes / static_cast<uint64_t>(r1);
      r0 = static_cast<int64_t>((b - at) / row);
      r1 = static_cast<int64_t>((e - at + row - 1) / row);
    }
    Clip clip(f, at + static_cast<uint64_t>(r0) * row, b, e);
    if (row > 0)
      append_tensor(rows_tensor(*u.tensor, r0, r1), clip, options.copy);
    else if (u.tensor)
      append_tensor(*u.tensor, clip, options.copy);
    else
      clip.write(u.bytes.data(), u.bytes.size());
    if (zip) pieces.push_back({unit, b - at, e - at, clip.crc()});
    bytes += e - b;
  });
  if (seq != l.units()) fail(ErrorCode::kInternal, "a part emitted a different layout than planned");
  if (options.copy.verify) options.copy.verify->check_deferred();  // before the receipt vouches for the bytes
  nlohmann::json uploaded = nlohmann::json::array(), stashed = nlohmann::json::array();
  for (auto& f : files) {
    f->finish();
    f->report(uploaded, stashed);
  }
  return {{"uploaded", uploaded}, {"stashed", stashed}, {"pieces", pieces}};
}

struct Receipt {
  std::string url;
  int part = -1, parts = 0;
  nlohmann::ordered_json body;
};

// The receipts under the state prefix, read now.
std::vector<Receipt> read_receipts(const std::string& state, const Layout& l) {
  std::vector<Receipt> out;
  for (const auto& url : s3_objects_below(state)) {
    const std::string name = url.substr(url.rfind('/') + 1);
    if (!name.starts_with("part-") || !name.ends_with(".json")) continue;
    auto text = s3_get_object(url);
    if (!text) continue;  // the finalizing worker removed it meanwhile
    Receipt r;
    r.url = url;
    try {
      r.body = parse_checkpoint_json(*text, url);  // another process wrote it
      if (r.body.at("plan").get<std::string>() != l.hash)
        fail(ErrorCode::kDataLoss, url + ": a receipt of another plan: run --part abort, then every part");
      r.part = r.body.at("part").get<int>();
      r.parts = r.body.at("parts").get<int>();
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCode::kDataLoss, url + ": not a receipt ckptconv wrote (" + e.what() + "): rerun its part");
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Runs the writer once more with every record's CRC-32, tensor bytes
// skipped, keeping what it writes into the stashed parts: their metadata.
class PatchSink final : public ByteSink {
 public:
  explicit PatchSink(std::vector<GridPart> stashed) : stashed_(std::move(stashed)) {}
  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    const auto* p = static_cast<const char*>(data);
    for (const auto& g : stashed_) {
      const uint64_t lo = std::max(position_, g.begin), hi = std::min(position_ + n, g.end);
      if (lo < hi) writes_.push_back({lo, std::string(p + (lo - position_), hi - lo)});
    }
    position_ += n;
  }
  uint64_t position() const override { return position_; }
  void skip(uint64_t n) override { position_ += n; }
  // The stashed part's bytes with the metadata written over them.
  void patch(const GridPart& g, std::string& bytes) const {
    for (const auto& [at, text] : writes_)
      if (at >= g.begin && at < g.end) std::memcpy(bytes.data() + (at - g.begin), text.data(), text.size());
  }

 private:
  std::vector<GridPart> stashed_;
  std::vector<std::pair<uint64_t, std::string>> writes_;
  uint64_t position_ = 0;
};

void remove_state(const std::string& state) {
  for (const auto& url : s3_objects_below(state)) s3_delete_object(url);
}

// Checks the receipts, uploads the stashes patched, completes the uploads
// and publishes the markers; then removes the state.
std::string finalize(PartedWriter& w, const PartedOptions& options, const Layout& l, int parts,
                     const std::vector<std::string>& ids, const std::string& state) {
  const Grid g = grid_of(l, parts);
  std::map<int, Receipt> by_part;
  for (auto& r : read_receipts(state, l)) {
    if (r.parts != parts)
      fail(ErrorCode::kDataLoss, r.url + ": a receipt of a run split " + std::to_string(r.parts) + " ways, this one " +
                                     std::to_string(parts) + ": run --part abort, then every part");
    by_part[r.part] = std::move(r);
  }
  std::string missing;
  for (int p = 0; p < parts; ++p)
    if (!by_part.count(p)) missing += (missing.empty() ? "" : ", ") + std::to_string(p) + "/" + std::to_string(parts);
  if (!missing.empty())
    fail(ErrorCode::kDataLoss, options.path + ": parts " + missing + " have no receipt in " + state +
                                   "/: rerun them (--part I/N), then finalize; nothing is visible at " + options.path);
  // Each part's ETag, or its stash, from the receipt of the worker that owns it.
  std::vector<std::map<uint64_t, std::string>> etags(l.names.size());
  std::set<std::pair<std::size_t, uint64_t>> stashes;
  std::vector<std::map<uint64_t, std::pair<uint64_t, uint32_t>>> pieces(l.units());  // begin -> end, CRC-32
  for (const auto& [p, r] : by_part) {
    auto owned_by = [&](std::size_t k, uint64_t number) {
      if (k >= g.files.size() || number < 1 || number > g.files[k].size() || g.files[k][number - 1].owner != p)
        fail(ErrorCode::kDataLoss, r.url + ": names part " + std::to_string(number) + " of file " + std::to_string(k) +
                                       ", which is not its part's: run --part abort");
    };
    for (const auto& e : r.body.at("uploaded")) {
      owned_by(e.at(0).get<std::size_t>(), e.at(1).get<uint64_t>());
      etags[e.at(0).get<std::size_t>()][e.at(1).get<uint64_t>()] = e.at(2).get<std::string>();
    }
    for (const auto& e : r.body.at("stashed")) {
      owned_by(e.at(0).get<std::size_t>(), e.at(1).get<uint64_t>());
      stashes.insert({e.at(0).get<std::size_t>(), e.at(1).get<uint64_t>()});
    }
    for (const auto& e : r.body.at("pieces")) {
      const auto u = e.at(0).get<std::size_t>();
      if (u >= l.units()) fail(ErrorCode::kDataLoss, r.url + ": names an item the plan does not have");
      pieces[u][e.at(1).get<uint64_t>()] = {e.at(2).get<uint64_t>(), e.at(3).get<uint32_t>()};
    }
  }
  for (std::size_t k = 0; k < g.files.size(); ++k)
    for (const auto& gp : g.files[k])
      if (gp.stashed ? !stashes.count({k, gp.number}) : !etags[k].count(gp.number))
        fail(ErrorCode::kDataLoss, by_part[gp.owner].url + ": part " + std::to_string(gp.number) + " of " +
                                       w.output_path(k) + " is missing: rerun part " + std::to_string(gp.owner));
  // Each record's CRC-32, its pieces joined in byte order.
  std::vector<uint32_t> crc(l.units(), 0);
  for (std::size_t u = 0; u < l.units(); ++u) {
    if (!l.zipped[u] || l.size[u] == 0) continue;
    uint64_t at = 0;
    for (const auto& [begin, piece] : pieces[u]) {
      if (begin != at) break;
      crc[u] = at == 0 ? piece.second : archive::crc32_combine(crc[u], piece.second, piece.first - begin);
      at = piece.first;
    }
    if (at != l.size[u])
      fail(ErrorCode::kDataLoss, state + "/: the receipts do not cover item " + std::to_string(u) + " of " +
                                     l.names[l.file[u]] + ": run --part abort, then every part");
  }
  if (!options.force) refuse_existing(w);
  std::vector<std::unique_ptr<PatchSink>> patches;
  std::vector<ByteSink*> sinks;
  for (std::size_t k = 0; k < g.files.size(); ++k) {
    std::vector<GridPart> stashed;
    for (const auto& gp : g.files[k])
      if (gp.stashed) stashed.push_back(gp);
    patches.push_back(std::make_unique<PatchSink>(std::move(stashed)));
    sinks.push_back(patches.back().get());
  }
  std::size_t seq = 0;
  w.run(sinks, [&](const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip) {
    if (seq >= l.units() || l.size[seq] != u.nbytes)
      fail(ErrorCode::kInternal, "finalize emitted a different layout than planned");
    skip_unit(u, sink, zip, crc[seq++]);
  });
  for (std::size_t k = 0; k < g.files.size(); ++k)
    for (const auto& gp : g.files[k]) {
      if (!gp.stashed) continue;
      check_interrupted();
      const std::string url = state + "/" + stash_name(k, gp.number);
      std::optional<std::string> bytes = s3_get_object(url);
      if (!bytes || bytes->size() != gp.end - gp.begin)
        fail(ErrorCode::kDataLoss, url + ": missing or not of its part's size: rerun part " + std::to_string(gp.owner));
      patches[k]->patch(gp, *bytes);
      etags[k][gp.number] = s3_upload_part(w.output_path(k), ids[k], gp.number, bytes->data(), bytes->size());
    }
  check_interrupted();
  const Published done = publish_uploads(w, options, [&](std::size_t k, bool overwrite) {
    std::vector<S3UploadedPart> sent;
    for (const auto& [number, etag] : etags[k]) sent.push_back({number, etag});
    s3_complete_upload(w.output_path(k), ids[k], sent, overwrite);
  });
  remove_state(state);
  return "finalized " + std::to_string(parts) + " parts (" + done.what + ")";
}

// Aborts the uploads of the plan and removes its state.
std::string abort_parts(PartedWriter& w, const Layout& l, const std::string& state) {
  std::size_t aborted = 0;
  if (auto text = s3_get_object(state + "/uploads.json")) {
    nlohmann::ordered_json j;
    try {
      j = parse_checkpoint_json(*text, state + "/uploads.json");
    } catch (const Error&) {
    }
    if (j.is_object() && j.contains("uploads") && j["uploads"].is_array() && j["uploads"].size() == l.names.size())
      for (std::size_t k = 0; k < l.names.size(); ++k)
        if (j["uploads"][k].is_string() && s3_abort_upload(w.output_path(k), j["uploads"][k].get<std::string>()))
          ++aborted;
  }
  remove_state(state);
  return "aborted " + std::to_string(aborted) + (aborted == 1 ? " upload" : " uploads") + " and removed " + state + "/";
}

// A name for the finalizing token no other worker's try writes.
std::string token_bytes(const PartSpec& part) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return nlohmann::json{{"part", part.index}, {"host", host}, {"pid", static_cast<int>(getpid())}}.dump();
}

}  // namespace

PartOutcome write_parted_to_object_store(PartedWriter& w, const PartedOptions& options, const PartSpec& part,
                                         const Layout& l) {
  const std::string state = part_plan::parts_dir(options.path, l);
  if (part.abort) return {false, abort_parts(w, l, state), 0, 0, {}};
  if (part.finalize_only) {
    std::vector<Receipt> receipts = read_receipts(state, l);
    auto uploads = s3_get_object(state + "/uploads.json");
    if (receipts.empty() || !uploads)
      fail(ErrorCode::kDataLoss, options.path + ": no part of this plan has been written (no receipt in " + state +
                                     "/): run the parts first, with the same source and options");
    return {true, finalize(w, options, l, receipts.front().parts, shared_uploads(w, l, state), state), 0, 0, {}};
  }
  if (!options.force) refuse_existing(w);  // before any work, as without --part
  const Grid g = grid_of(l, part.count);
  const std::vector<std::string> ids = shared_uploads(w, l, state);
  if (!options.request.empty() && !s3_get_object(state + "/request.json"))
    s3_put_object(state + "/request.json", options.request, true);
  uint64_t bytes = 0;
  nlohmann::json receipt;
  try {
    receipt = write_share(w, options, part, l, g, ids, state, bytes);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInterrupted) throw;
    fail(ErrorCode::kInterrupted, "nothing was written at " + options.path + "; its uploads stay open for the " +
                                      "other parts, and this part has no receipt: rerun it (--part " +
                                      std::to_string(part.index) + "/" + std::to_string(part.count) +
                                      "), or give up with --part abort");
  }
  check_interrupted();
  receipt["plan"] = l.hash;
  receipt["part"] = part.index;
  receipt["parts"] = part.count;
  s3_put_object(state + "/" + receipt_name(part.index, part.count), receipt.dump(), true);
  PartOutcome outcome;
  outcome.tensors = receipt["pieces"].size();
  outcome.bytes = bytes;
  outcome.summary = "wrote part " + std::to_string(part.index) + "/" + std::to_string(part.count) + " (" +
                    std::to_string(bytes) + " bytes) into the uploads of " + options.path;
  // The worker whose receipt completes the set finalizes; a PUT with
  // If-None-Match: * elects one when several complete it at once.
  std::set<std::string> done;
  for (const auto& url : s3_objects_below(state)) {
    const std::string name = url.substr(url.rfind('/') + 1);
    if (name.starts_with("part-") && name.ends_with("-of-" + std::to_string(part.count) + ".json")) done.insert(name);
  }
  if (static_cast<int>(done.size()) < part.count) {
    outcome.summary += "; " + std::to_string(done.size()) + " of " + std::to_string(part.count) + " parts done";
    return outcome;
  }
  const std::string token = state + "/finalizing";
  if (!s3_put_new_object(token, token_bytes(part))) {
    outcome.summary += "; another worker is finalizing (if it died, rerun with --part finalize)";
    return outcome;
  }
  try {
    outcome.summary += "; " + finalize(w, options, l, part.count, ids, state) + " into " + options.path;
  } catch (...) {
    s3_delete_object(token);  // a rerun may try again
    throw;
  }
  outcome.published = true;
  return outcome;
}

}  // namespace ckpt
