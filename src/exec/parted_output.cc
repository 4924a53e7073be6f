#include "exec/parted_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "exec/checksum.h"
#include "formats/safetensors/safetensors_writer.h"
#include "formats/torch_pt/pt_writer.h"
#include "io/byte_sink.h"
#include "io/part_sink.h"
#include "model/validate.h"

namespace ckpt {
namespace fs = std::filesystem;
namespace {

// Produces tensor `index`'s bytes into the writer: `zip` is the .pt
// archive's writer (null for safetensors, whose bytes go to `sink`).
using Fill = std::function<void(std::size_t index, ByteSink& sink, archive::ZipWriter* zip)>;

// The format's own writer, file by file (a sharded safetensors output is
// several): the same bytes as write_output's.
struct Writer {
  Writer(const CheckpointModel& m, OutputFormat f, const OutputOptions& options)
      : model(m), format(f), out(options.path) {
    if (format == OutputFormat::kSafetensors)
      plan = safetensors::plan_safetensors(model, out.filename().string(), options.max_shard_size);
  }
  std::size_t files() const { return format == OutputFormat::kPt ? 1 : plan.files.size(); }
  // Where file k is published.
  std::string destination(std::size_t k) const {
    if (format == OutputFormat::kPt) return out.string();
    return (out.parent_path() / plan.files.at(k).file_name).string();
  }
  void run(std::size_t k, ByteSink& sink, const Fill& fill) const {
    if (format == OutputFormat::kPt) {
      torch_pt::write_pt(sink, *model.root, pt_output_tensors(model),
                         [&](std::size_t i, archive::ZipWriter& zip) { fill(i, sink, &zip); });
      return;
    }
    safetensors::write_safetensors_file(sink, plan.files.at(k),
                                        [&](std::size_t i, ByteSink& s) { fill(i, s, nullptr); });
  }

  const CheckpointModel& model;
  OutputFormat format;
  fs::path out;
  safetensors::Plan plan;
};

// Where every tensor's bytes go in the output (which file, at what offset),
// found by running the writer against counting sinks, and which worker
// writes them.
struct Layout {
  std::vector<std::size_t> file;  // per tensor
  std::vector<uint64_t> offset, size;
  std::vector<int> owner;
  std::vector<uint64_t> total;  // per file
  std::string hash;             // of the plan and the source's files: receipts of another plan are stale

  PartSink::Ranges ranges_of(int part, std::size_t k) const {
    PartSink::Ranges r;
    for (std::size_t i = 0; i < offset.size(); ++i)
      if (owner[i] == part && file[i] == k && size[i] > 0) r.emplace_back(offset[i], offset[i] + size[i]);
    std::sort(r.begin(), r.end());
    return r;
  }
  // Every byte of file k no tensor holds: what the finalizing process writes.
  PartSink::Ranges metadata(std::size_t k) const {
    PartSink::Ranges tensors, out;
    for (std::size_t i = 0; i < offset.size(); ++i)
      if (file[i] == k && size[i] > 0) tensors.emplace_back(offset[i], offset[i] + size[i]);
    std::sort(tensors.begin(), tensors.end());
    uint64_t at = 0;
    for (const auto& [b, e] : tensors) {
      if (b > at) out.emplace_back(at, b);
      at = std::max(at, e);
    }
    if (at < total.at(k)) out.emplace_back(at, total[k]);
    return out;
  }
};

Layout layout_of(const Writer& w) {
  const CheckpointModel& model = w.model;
  Layout l;
  l.file.assign(model.tensors.size(), 0);
  l.offset.assign(model.tensors.size(), 0);
  l.size.assign(model.tensors.size(), 0);
  for (std::size_t k = 0; k < w.files(); ++k) {
    PartSink counter(-1, {}, "layout");
    w.run(k, counter, [&](std::size_t i, ByteSink& sink, archive::ZipWriter* zip) {
      uint64_t n = model.tensors.at(i).output_nbytes();
      l.file[i] = k;
      l.offset[i] = sink.position();
      l.size[i] = n;
      if (zip)
        zip->append_elsewhere(n, 0);
      else
        sink.skip(n);
    });
    l.total.push_back(counter.position());
  }
  Hasher h(ChecksumAlgorithm::kXxh3_64);
  auto add = [&](const std::string& text) {
    h.update(text.data(), text.size());
    h.update("\n", 1);
  };
  add(output_format_name(w.format));
  for (std::size_t k = 0; k < w.files(); ++k) add(w.destination(k) + " " + std::to_string(l.total[k]));
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const TensorEntry& t = model.tensors[i];
    add(t.name + " " + std::string(dtype_name(t.output_dtype())) + " " + shape_str(t.shape) + " " +
        std::to_string(l.file[i]) + " " + std::to_string(l.offset[i]) + " " + std::to_string(l.size[i]));
  }
  for (const auto& f : model.info.files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0)
      add(f + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
          std::to_string(st.st_mtim.tv_nsec));
  }
  l.hash = h.hex_digest();
  return l;
}

// Which worker writes each tensor when the output is split `parts` ways
// (the plan's hash does not depend on it: the parts folder is found first).
void assign_owners(Layout& l, int parts) {
  l.owner.assign(l.size.size(), 0);
  // Owners by bytes, not tensor count: tensor i goes to the part its middle
  // byte falls in, counting tensor bytes in output order.
  std::vector<std::size_t> order(l.size.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(l.file[a], l.offset[a]) < std::pair(l.file[b], l.offset[b]);
  });
  uint64_t all = 0;
  for (uint64_t n : l.size) all += n;
  uint64_t before = 0;
  for (std::size_t i : order) {
    long double middle = static_cast<long double>(before) + static_cast<long double>(l.size[i]) / 2;
    int part = all == 0 ? 0 : static_cast<int>(middle * parts / static_cast<long double>(all));
    l.owner[i] = std::clamp(part, 0, parts - 1);
    before += l.size[i];
  }
}

std::string data_file(const std::string& dir, std::size_t k) { return dir + "/data-" + std::to_string(k); }

std::string parts_dir(const OutputOptions& options, const Layout& l) { return options.path + ".parts-" + l.hash; }

std::string receipt_name(int part, int parts) {
  return "part-" + std::to_string(part) + "-of-" + std::to_string(parts) + ".json";
}

struct Receipt {
  std::string file;
  std::string plan;
  int part = -1, parts = 0;
  std::map<std::size_t, uint32_t> crcs;  // tensor index -> CRC-32 of its output bytes
};

std::vector<Receipt> read_receipts(const std::string& dir) {
  std::vector<Receipt> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with("part-") || !name.ends_with(".json")) continue;
    Receipt r;
    r.file = entry.path().string();
    try {
      SourcePtr src = open_file_source(r.file);
      auto j = nlohmann::json::parse(src->read_string(0, static_cast<std::size_t>(src->size())));
      r.plan = j.at("plan").get<std::string>();
      r.part = j.at("part").get<int>();
      r.parts = j.at("parts").get<int>();
      for (const auto& t : j.at("tensors")) r.crcs[t.at(0).get<std::size_t>()] = t.at(3).get<uint32_t>();
    } catch (const std::exception& e) {
      fail(ErrorCode::kDataLoss,
           r.file + ": not a receipt ckptconv wrote (" + e.what() + "): remove it and rerun its part");
    }
    out.push_back(std::move(r));
  }
  return out;
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Checks the receipts against the plan and writes every byte no tensor
// holds, with the receipts' CRC-32s, then publishes the file.
std::string finalize(const Writer& w, const OutputOptions& options, const Layout& l, int parts) {
  const CheckpointModel& model = w.model;
  std::string dir = parts_dir(options, l);
  std::vector<Receipt> receipts = read_receipts(dir);
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
  std::vector<uint32_t> crc(model.tensors.size(), 0);
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const Receipt& r = *by_part.at(l.owner[i]);
    auto it = r.crcs.find(i);
    if (it == r.crcs.end())
      fail(ErrorCode::kDataLoss, r.file + ": does not cover tensor '" + model.tensors[i].name +
                                     "', which its part owns: rerun part " + std::to_string(r.part));
    crc[i] = it->second;
  }
  for (const auto& r : receipts)
    for (const auto& [i, c] : r.crcs)
      if (i >= model.tensors.size() || l.owner[i] != r.part)
        fail(ErrorCode::kDataLoss,
             r.file + ": names a tensor its part does not own: rerun part " + std::to_string(r.part));
  for (std::size_t k = 0; k < w.files(); ++k)
    if (!options.force && fs::exists(fs::symlink_status(w.destination(k))))
      fail_invalid(w.destination(k) + ": output exists (use --force to overwrite)");
  for (std::size_t k = 0; k < w.files(); ++k) {
    std::string data = data_file(dir, k);
    int fd = ::open(data.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) fail(ErrorCode::kDataLoss, data + ": a shared output file of the parts is missing: rerun every part");
    try {
      PartSink sink(fd, l.metadata(k), w.destination(k));
      w.run(k, sink, [&](std::size_t i, ByteSink& out, archive::ZipWriter* zip) {
        if (zip)
          zip->append_elsewhere(l.size[i], crc[i]);
        else
          out.skip(l.size[i]);
      });
      if (sink.position() != l.total[k]) fail(ErrorCode::kInternal, "finalize wrote a different layout than planned");
      if (::ftruncate(fd, static_cast<off_t>(l.total[k])) != 0 || (options.durable && ::fsync(fd) != 0))
        fail(ErrorCode::kOutputFailed, data + ": " + std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  // A sharded output's index, complete before anything is published.
  std::unique_ptr<AtomicFileSink> index;
  if (!w.plan.index_json.empty()) {
    index = AtomicFileSink::create(options.path + ".index.json", options.force, options.durable);
    index->write(w.plan.index_json);
    index->complete();
  }
  check_interrupted();
  // All files or none: shards first, the index last (as write_output).
  std::vector<std::string> published;
  try {
    for (std::size_t k = 0; k < w.files(); ++k) {
      if (std::rename(data_file(dir, k).c_str(), w.destination(k).c_str()) != 0)
        fail(ErrorCode::kOutputFailed,
             w.destination(k) + ": cannot rename the finished output into place: " + std::strerror(errno));
      published.push_back(w.destination(k));
    }
    if (index) index->publish();
  } catch (const Error&) {
    for (const auto& f : published) ::unlink(f.c_str());
    throw;
  }
  if (options.durable)
    fsync_path(fs::path(options.path).parent_path().empty() ? "." : fs::path(options.path).parent_path().string());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return "finalized " + std::to_string(parts) + " parts" +
         (w.files() > 1 ? " (" + std::to_string(w.files()) + " shards and the index)" : std::string());
}

// This worker's bytes and receipt, and the finalization when its receipt
// completes the set.
PartOutcome write_part(const Writer& w, const OutputOptions& options, const PartSpec& part, const Layout& l,
                       const std::string& dir) {
  const CheckpointModel& model = w.model;
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t bytes = 0;
  for (std::size_t k = 0; k < w.files(); ++k) {
    std::string data = data_file(dir, k);
    int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail(ErrorCode::kOutputFailed, data + ": " + std::strerror(errno));
    try {
      PartSink sink(fd, l.ranges_of(part.index, k), w.destination(k));
      w.run(k, sink, [&](std::size_t i, ByteSink& s, archive::ZipWriter* zip) {
        if (l.owner[i] != part.index) {
          if (zip)
            zip->append_elsewhere(l.size[i], 0);
          else
            s.skip(l.size[i]);
          return;
        }
        uint32_t crc = 0;
        if (zip) {
          append_tensor(model.tensors[i], *zip, options.copy);
          crc = zip->record_crc();
        } else {
          append_tensor(model.tensors[i], s, options.copy);
        }
        tensors.push_back({i, l.offset[i], l.size[i], crc});
        bytes += l.size[i];
      });
      if (options.durable && ::fdatasync(fd) != 0) fail(ErrorCode::kOutputFailed, data + ": " + std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  check_interrupted();
  nlohmann::json receipt = {
      {"plan", l.hash}, {"part", part.index}, {"parts", part.count}, {"output", options.path}, {"tensors", tensors}};
  auto sink = AtomicFileSink::create(dir + "/" + receipt_name(part.index, part.count), true, options.durable);
  sink->write(receipt.dump());
  sink->finish();
  PartOutcome outcome;
  outcome.tensors = tensors.size();
  outcome.bytes = bytes;
  outcome.summary = "wrote part " + std::to_string(part.index) + "/" + std::to_string(part.count) + " (" +
                    std::to_string(tensors.size()) + " tensors, " + std::to_string(bytes) + " bytes) into " + dir;
  // The worker whose receipt completes the set finalizes; an exclusive
  // create elects one when several complete it at once.
  std::map<int, bool> done;
  for (const auto& r : read_receipts(dir))
    if (r.plan == l.hash && r.parts == part.count) done[r.part] = true;
  if (static_cast<int>(done.size()) < part.count) {
    outcome.summary += "; " + std::to_string(done.size()) + " of " + std::to_string(part.count) + " parts done";
    return outcome;
  }
  std::string elect = dir + "/finalizing";
  int token = ::open(elect.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (token < 0) {
    outcome.summary += "; another worker is finalizing";
    return outcome;
  }
  ::close(token);
  try {
    outcome.summary += "; " + finalize(w, options, l, part.count) + " into " + options.path;
  } catch (...) {
    ::unlink(elect.c_str());  // a rerun may try again
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
      fail_invalid("--part must be I/N (worker I of N, 0 <= I < N), auto or finalize, not '" + text + "'");
    p.index = std::atoi(text.substr(0, slash).c_str());
    p.count = std::atoi(text.substr(slash + 1).c_str());
    p.from = "--part";
  }
  if (p.count < 1 || p.index < 0 || p.index >= p.count)
    fail_invalid("--part " + text + " (" + p.from + "): worker " + std::to_string(p.index) + " of " +
                 std::to_string(p.count) + " is not one of 0.." + std::to_string(std::max(0, p.count - 1)));
  return p;
}

PartOutcome write_output_part(const CheckpointModel& model, OutputFormat format, const OutputOptions& options,
                              const PartSpec& part) {
  require_valid(model);
  if (format == OutputFormat::kHdf5)
    fail_invalid(
        "--part: HDF5 output cannot be written by several processes (that needs an MPI-IO build of "
        "libhdf5); write .pt or .safetensors, or run without --part");
  Writer w(model, format, options);
  if (part.finalize_only) {
    // The folder's name does not depend on the number of parts; the
    // receipts in it say what it was.
    Layout l = layout_of(w);
    std::string dir = parts_dir(options, l);
    std::vector<Receipt> receipts = read_receipts(dir);
    if (receipts.empty())
      fail(ErrorCode::kDataLoss, options.path + ": no part of this plan has been written (no receipt in " + dir +
                                     "): run the parts first, with the same source and options");
    int parts = receipts.front().parts;
    assign_owners(l, parts);
    return {true, finalize(w, options, l, parts), 0, 0};
  }
  for (std::size_t k = 0; k < w.files(); ++k)  // before any work, as without --part
    if (!options.force && fs::exists(fs::symlink_status(w.destination(k))))
      fail_invalid(w.destination(k) + ": output exists (use --force to overwrite)");
  Layout l = layout_of(w);
  assign_owners(l, part.count);
  std::string dir = parts_dir(options, l);
  fs::create_directories(dir);
  try {
    return write_part(w, options, part, l, dir);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInterrupted) throw;
    fail(ErrorCode::kInterrupted, "nothing was written at " + options.path + "; " + dir +
                                      " keeps the other parts' bytes and receipts, and this part has no receipt: "
                                      "rerun it (--part " +
                                      std::to_string(part.index) + "/" + std::to_string(part.count) + ")");
  }
}

}  // namespace ckpt
