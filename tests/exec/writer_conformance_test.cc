// The writer conformance suite, one TEST_CASE per output format and per
// reshard layout ("writer conformance: format <name>", "writer conformance:
// layout <name>"), each through its job's entry point (jobs::run_consolidate,
// jobs::run_reshard) as the CLI calls it:
//
//   formats  every registered output format (exec/write_output.h
//            output_formats()), whole and, where it shards, sharded, written
//            by consolidate from one DCP fixture and read back by the reader
//            of that format
//   layouts  every --layout of reshard (cli/reshard.cc), written from a
//            committed fixture of the kind the layout needs, for another world
//            size, and read back by the project's reader of that layout
//            (formats/detect.h read_checkpoint)
//
// Either way the output must read back as its kind, validate, and equal its
// source: the tree (every key, every value) and every tensor's bytes, diff at
// zero tolerance (bytes are copied, never recomputed); publication leaves
// nothing but the output beside it (no staging folder, no temporary file);
// and the same job failing part way through writing (its files may not grow
// past half the size of the largest one it wrote) fails with exit 4 and
// leaves nothing at the destination or beside it.
// The real libraries' view of these files (torch.load, h5py, safetensors,
// dcp.load, DeepSpeed and megatron-core loading them) is tested in pytest.
#include <catch2/catch.hpp>

#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "diff/checkpoint_diff.h"
#include "exec/parted_output.h"
#include "exec/write_output.h"
#include "formats/detect.h"
#include "jobs/consolidate.h"
#include "jobs/reshard.h"
#include "model/tree_walk.h"
#include "model/validate.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

fs::path scratch() {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-writers-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A tied weight is two leaves of one tensor.
std::size_t tensor_leaves(const CheckpointModel& m) {
  std::size_t n = 0;
  walk_leaves(*m.root, [&](const Leaf& leaf) { n += leaf.tensor ? 1 : 0; });
  return n;
}

// `back` (the output read back) equals `source`: the tree, every value and
// every tensor's bytes. `as_fp32`: tensors the layout writes as float32 by
// its definition (their values equal, their dtype float32); every other
// tensor keeps its dtype.
void check_equal(const CheckpointModel& back, const CheckpointModel& source,
                 const std::vector<std::string>& as_fp32 = {}) {
  CHECK_NOTHROW(require_valid(back));
  DiffOptions options;
  options.ignore_dtype = !as_fp32.empty();
  DiffReport diff = diff_models(back, source, options);
  CHECK(diff.tensors.size() == tensor_leaves(source));
  CHECK(diff.only_in_a.empty());
  CHECK(diff.only_in_b.empty());
  CHECK(diff.structure.empty());
  CHECK(diff.values.empty());
  CHECK(diff.equal());
  std::vector<std::string> cast;
  for (const TensorDiff& t : diff.tensors)
    if (t.dtype_a != t.dtype_b) {
      INFO(t.path);
      CHECK(t.dtype_a == DType::kFloat32);
      cast.push_back(t.path);
    }
  CHECK(cast == as_fp32);
}

// The largest regular file under `path` (a file or a folder), in bytes.
uint64_t largest_file(const fs::path& path) {
  if (fs::is_regular_file(path)) return fs::file_size(path);
  uint64_t most = 0;
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file()) most = std::max<uint64_t>(most, e.file_size());
  return most;
}

// Atomic publication: `job` writes into `dir` (empty) in a child process
// whose files may not grow past `limit` bytes (RLIMIT_FSIZE, SIGXFSZ
// ignored: a write past it fails with EFBIG), so it fails part way through
// writing its output. 0 when it began writing (inotify saw something made in
// `dir`: its staging folder or files), failed with a ckpt::Error of exit 4
// (the output could not be written) and left `dir` empty; else what went
// wrong: 1 the job finished, 2 another ckpt::Error (printed), 3 another
// exception, 4 something left in `dir`, 5 nothing was made in `dir` (it
// failed before writing: this proves nothing), 6 the set-up failed; 100+N
// killed by signal N.
int failed_write_leaves_nothing(const fs::path& dir, uint64_t limit, const std::function<void()>& job) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int watch = ::inotify_init1(IN_NONBLOCK);
    rlimit fsize{limit, limit};
    if (watch < 0 || ::inotify_add_watch(watch, dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0 ||
        std::signal(SIGXFSZ, SIG_IGN) == SIG_ERR || ::setrlimit(RLIMIT_FSIZE, &fsize) != 0)
      ::_exit(6);
    int rc = 0;
    try {
      job();
      rc = 1;
    } catch (const Error& e) {
      rc = exit_code_for(e.code()) == 4 ? 0 : 2;
      if (rc) std::fprintf(stderr, "failed_write_leaves_nothing: %s\n", e.what());
    } catch (...) {
      rc = 3;
    }
    alignas(inotify_event) char events[4096];
    if (rc == 0 && !fs::is_empty(dir)) rc = 4;
    if (rc == 0 && ::read(watch, events, sizeof events) <= 0) rc = 5;
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

SourceKind kind_read_as(OutputFormat f, bool sharded) {
  switch (f) {
    case OutputFormat::kPt: return SourceKind::kTorchPt;
    case OutputFormat::kSafetensors: return sharded ? SourceKind::kSafetensorsIndex : SourceKind::kSafetensors;
    case OutputFormat::kHdf5: return SourceKind::kHdf5;
  }
  return SourceKind::kTorchPt;
}

// The contract of an output format: consolidate writes the DCP fixture as
// OUT (sharded: shards of at most 300 bytes and their index), its reader
// gives it back equal.
void check_format(OutputFormat id, bool sharded) {
  const OutputFormatInfo& f = output_format_info(id);
  REQUIRE((!sharded || f.shards));
  fs::path dir = scratch();
  const std::string source = testdata("dcp/fsdp2_adamw_ws2");
  jobs::ConsolidateRequest req;
  req.common.source = source;
  req.common.no_fsync = true;
  req.output = (dir / ((sharded ? "sharded" : "whole") + std::string(f.extensions.front()))).string();
  if (sharded) req.max_shard_size = "300";
  std::ostringstream out;
  jobs::JobReport report = jobs::run_consolidate(req, out);
  CHECK(report.exit_code == 0);
  // what a user names to read it back: OUT, or the index of the shards
  const std::string read_back = sharded ? req.output + ".index.json" : req.output;
  REQUIRE(fs::is_regular_file(read_back));
  // published: the output's files and nothing else
  std::vector<std::string> names = names_in(dir);
  if (sharded) {
    CHECK(names.size() > 2);
    for (const auto& n : names) CHECK(n.rfind("sharded", 0) == 0);
    for (const auto& n : names) CHECK(n.find(".tmp") == std::string::npos);
  } else {
    CHECK(names == std::vector<std::string>{fs::path(req.output).filename().string()});
  }
  CheckpointModel back = read_checkpoint(read_back);
  CHECK(back.info.kind == kind_read_as(id, sharded));
  check_equal(back, read_checkpoint(source));

  // failing part way through writing: nothing at the destination, nothing beside it
  fs::path failed = dir / "failed";
  fs::create_directories(failed);
  const uint64_t limit = largest_file(dir) / 2;
  req.output = (failed / fs::path(req.output).filename()).string();
  CHECK(failed_write_leaves_nothing(failed, limit, [&] {
          std::ostringstream ignored;
          jobs::run_consolidate(req, ignored);
        }) == 0);
  fs::remove_all(dir);
}

// A reshard layout's case: the fixture, its read options, the world size to write.
struct Layout {
  std::string layout;  // --layout
  std::string source;
  std::optional<int> world_size;
  SourceKind read_as;                     // the kind the output reads back as
  std::string param_layout = {};          // --param-layout, to read the source and the output (FSDP1 flat)
  std::string output_name = "out";        // the output directory's name
  std::vector<std::string> beside = {};   // what the layout writes beside the output, besides it
  std::vector<std::string> as_fp32 = {};  // tensors the layout writes as float32 (check_equal)
  std::optional<int> tp = {}, pp = {};    // --tp / --pp (megatron-legacy)
  std::string read_back = {};             // the folder under the output its reader reads ("": the output)
};

// The contract of a reshard layout: run_reshard writes the fixture in the
// layout, its reader gives it back equal, at the new world size.
void check_layout(const Layout& l) {
  fs::path dir = scratch();
  ReadOptions read;
  read.param_layout = l.param_layout;
  CheckpointModel source = read_checkpoint(l.source, read);
  jobs::ReshardRequest req;
  req.common.source = l.source;
  req.common.param_layout = l.param_layout;
  req.common.no_fsync = true;
  req.output = (dir / l.output_name).string();
  req.world_size = l.world_size;
  req.tp = l.tp;
  req.pp = l.pp;
  req.layout = l.layout;
  std::ostringstream out;
  jobs::JobReport report = jobs::run_reshard(req, out);
  CHECK(report.exit_code == 0);
  CHECK(report.tensors == source.tensors.size());
  REQUIRE(fs::is_directory(req.output));
  // published: the output directory (and what the layout writes beside it), nothing else
  std::vector<std::string> expected = l.beside;
  expected.push_back(l.output_name);
  std::sort(expected.begin(), expected.end());
  CHECK(names_in(dir) == expected);

  CheckpointModel back = read_checkpoint(l.read_back.empty() ? req.output : req.output + "/" + l.read_back, read);
  CHECK(back.info.kind == l.read_as);
  if (l.world_size) CHECK(back.info.world_sizes == std::vector<int>{*l.world_size});
  for (const auto& f : back.info.files) CHECK(fs::is_regular_file(f));
  check_equal(back, source, l.as_fp32);

  // failing part way through writing: nothing at the destination, nothing beside it
  fs::path failed = dir / "failed";
  fs::create_directories(failed);
  const uint64_t limit = largest_file(req.output) / 2;
  req.output = (failed / l.output_name).string();
  CHECK(failed_write_leaves_nothing(failed, limit, [&] {
          std::ostringstream ignored;
          jobs::run_reshard(req, ignored);
        }) == 0);
  fs::remove_all(dir);
}

}  // namespace

// ---- output formats (consolidate)

TEST_CASE("writer conformance: format pt", "[exec][writers][conformance]") { check_format(OutputFormat::kPt, false); }

TEST_CASE("writer conformance: format safetensors", "[exec][writers][conformance]") {
  check_format(OutputFormat::kSafetensors, false);
}

TEST_CASE("writer conformance: format safetensors, sharded", "[exec][writers][conformance]") {
  check_format(OutputFormat::kSafetensors, true);
}

#ifdef CKPT_HAVE_HDF5
TEST_CASE("writer conformance: format hdf5", "[exec][writers][conformance]") {
  check_format(OutputFormat::kHdf5, false);
}
#endif

TEST_CASE("writer conformance: every output format has its case", "[exec][writers][conformance]") {
  // A new row of output_formats() needs a case above.
  std::vector<OutputFormat> covered = {OutputFormat::kPt, OutputFormat::kSafetensors, OutputFormat::kHdf5};
  for (const OutputFormatInfo& f : output_formats()) {
    INFO(f.name);
    CHECK(std::find(covered.begin(), covered.end(), f.id) != covered.end());
    if (f.shards) CHECK(f.id == OutputFormat::kSafetensors);
  }
}

// ---- reshard layouts (reshard), each from a fixture of the kind it needs

TEST_CASE("writer conformance: layout dcp", "[exec][writers][conformance]") {
  check_layout({"dcp", testdata("dcp/fsdp2_adamw_ws3"), 2, SourceKind::kDcpDir});
}

TEST_CASE("writer conformance: layout hf", "[exec][writers][conformance]") {
  check_layout({"hf", testdata("dcp_hf/fsdp2_ws3"), 2, SourceKind::kDcpHf});
}

TEST_CASE("writer conformance: layout fsdp-sharded-tensor", "[exec][writers][conformance]") {
  check_layout({"fsdp-sharded-tensor", testdata("fsdp_st/adamw_ws3"), 2, SourceKind::kFsdpRanks});
}

TEST_CASE("writer conformance: layout fsdp-dtensor", "[exec][writers][conformance]") {
  check_layout({"fsdp-dtensor", testdata("fsdp_dt/adamw_ws2"), 3, SourceKind::kFsdpRanks});
}

TEST_CASE("writer conformance: layout accelerate", "[exec][writers][conformance]") {
  check_layout({"accelerate", testdata("frameworks/accelerate_fsdp1_ws2/project/checkpoints/checkpoint_1"), 3,
                SourceKind::kDcpPair});
}

// A universal checkpoint holds frozen parameters as fp32 (zero/<name>/fp32.pt,
// formats/ds_universal/ds_universal_writer.h); the sources keep them in the
// job's low-precision dtype: equal values, float32.
TEST_CASE("writer conformance: layout deepspeed-universal", "[exec][writers][conformance]") {
  check_layout({"deepspeed-universal",
                testdata("ucp/z2_bf16_ws2"),
                std::nullopt,
                SourceKind::kDsUniversal,
                "",
                "global_step3_universal",
                {"latest_universal"},
                {"model.frozen.weight"}});
}

TEST_CASE("writer conformance: layout deepspeed-universal, from ZeRO-2", "[exec][writers][conformance]") {
  check_layout({"deepspeed-universal",
                testdata("zero/z2_bf16_ws2"),
                std::nullopt,
                SourceKind::kDsUniversal,
                "",
                "global_step3_universal",
                {"latest_universal"},
                {"model.frozen.weight"}});
}

TEST_CASE("writer conformance: layout fsdp1-flat", "[exec][writers][conformance]") {
  check_layout({"fsdp1-flat", testdata("fsdp1/torch2.15/orig_adamw_ws3"), 2, SourceKind::kFsdpRanks,
                testdata("fsdp1/torch2.15/orig_adamw_ws3/layout.pt")});
}

TEST_CASE("writer conformance: layout megatron", "[exec][writers][conformance]") {
  check_layout({"megatron", testdata("megatron/gpt_tp1pp1/ckpt"), 2, SourceKind::kMegatron});
}

// At the source's own TP 2 x PP 2, so that its args (which say TP and PP) read back equal too.
TEST_CASE("writer conformance: layout megatron-legacy", "[exec][writers][conformance]") {
  Layout l{"megatron-legacy", testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), std::nullopt,
           SourceKind::kMegatronLegacy};
  l.tp = 2;
  l.pp = 2;
  l.read_back = "iter_0000007";
  check_layout(l);
}

TEST_CASE("output formats are found by every name and extension they list", "[exec][writers]") {
  for (const OutputFormatInfo& f : output_formats()) {
    CHECK(output_format_from_name(std::string(f.name)) == f.id);
    for (auto alias : f.aliases) CHECK(output_format_from_name(std::string(alias)) == f.id);
    for (auto ext : f.extensions) {
      CHECK(output_format_from_path("out" + std::string(ext)) == f.id);
      std::string upper = "OUT" + std::string(ext);
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      CHECK(output_format_from_path(upper) == f.id);
    }
    CHECK(output_format_from_path("out/" + std::string(f.weights_file)) == f.id);
    CHECK(output_format_from_path("out/" + std::string(f.full_file)) == f.id);
    CHECK(std::string(output_format_name(f.id)) == f.name);
    CHECK(output_extensions_text().find(std::string(f.extensions.front())) != std::string::npos);
  }
  CHECK_FALSE(output_format_from_name("safetensor"));
  CHECK_FALSE(output_format_from_path("out.safetensor"));
}

// The parted driver (exec/parted_output.h) over each format's PartedWriter:
// three workers, run one after another here as three processes would, give
// the same bytes as the one-process writer; the last to finish publishes.
TEST_CASE("every format that takes --part writes the one-process bytes from its parts", "[exec][writers][parts]") {
  fs::path dir = scratch();
  CheckpointModel model = read_checkpoint(testdata("dcp/fsdp2_adamw_ws2"));
  std::size_t formats = 0;
  for (const OutputFormatInfo& f : output_formats()) {
    if (!f.parted) continue;
    ++formats;
    for (bool sharded : {false, true}) {
      if (sharded && !f.shards) continue;
      INFO(std::string(f.name) << (sharded ? " sharded" : ""));
      std::string name = (sharded ? "sharded" : "whole") + std::string(f.extensions.front());
      OutputOptions whole;
      whole.path = (dir / "one" / name).string();
      whole.durable = false;
      whole.max_shard_size = sharded ? 300 : 0;
      fs::create_directories(dir / "one");
      std::vector<std::string> expected = write_output(model, f.id, whole);
      OutputOptions parted = whole;
      parted.path = (dir / "parts" / name).string();
      fs::create_directories(dir / "parts");
      for (int i = 0; i < 3; ++i) {
        PartOutcome done = write_output_part(model, f.id, parted, {i, 3, false, "test"}, "{}");
        CHECK(done.published == (i == 2));
        if (i < 2)
          for (const auto& file : expected) CHECK_FALSE(fs::exists(dir / "parts" / fs::path(file).filename()));
      }
      for (const auto& file : expected) {
        INFO(file);
        CHECK(bytes_of((dir / "parts" / fs::path(file).filename()).string()) == bytes_of(file));
      }
    }
  }
  CHECK(formats >= 2);  // .pt and .safetensors
  fs::remove_all(dir);
}
