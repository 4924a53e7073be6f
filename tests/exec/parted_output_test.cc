// The output driver (exec/parted_output.h) over a writer made for the test:
// write_whole publishes every file or none, refuses an output that exists
// before it starts or appears while it runs (never replacing it), leaves no
// scratch behind, and write_parted's parts give write_whole's bytes.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "exec/parted_output.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckpt_parted_output_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Two files beside each other, each a header, then two units of raw bytes
// (what a writer emits for bytes that are no tensor), then a trailer; a
// hook runs after file 0 is written.
class TwoFiles final : public PartedWriter {
 public:
  explicit TwoFiles(fs::path dir) : dir_(std::move(dir)) {}
  std::function<void()> after_first;
  int runs = 0;

  std::string kind() const override { return "test"; }
  std::vector<std::string> file_names() const override { return {"a.bin", "b.bin"}; }
  std::vector<std::string> destinations() const override { return {output_path(0), output_path(1)}; }
  std::string output_path(std::size_t k) const override { return (dir_ / file_names().at(k)).string(); }
  void run(const std::vector<ByteSink*>& sinks, const EmitUnit& emit) override {
    ++runs;
    for (std::size_t k = 0; k < 2; ++k) {
      ByteSink& s = *sinks.at(k);
      s.write("head" + std::to_string(k));
      for (std::string_view unit : {unit_a_, unit_b_}) emit({k, unit.size(), nullptr, unit}, s, nullptr);
      s.write("tail");
      if (k == 0 && after_first) after_first();
    }
  }
  Published publish(const std::function<std::string(std::size_t)>& data_path, bool force, bool) override {
    rename_all(data_path, destinations(), force);
    return {destinations(), "two files"};
  }

 private:
  fs::path dir_;
  std::string unit_a_ = std::string(1000, 'a');
  std::string unit_b_ = std::string(3000, 'b');
};

const std::string kFileA = "head0" + std::string(1000, 'a') + std::string(3000, 'b') + "tail";
const std::string kFileB = "head1" + std::string(1000, 'a') + std::string(3000, 'b') + "tail";

PartedOptions options_for(const fs::path& dir) {
  PartedOptions o;
  o.path = (dir / "a.bin").string();
  o.durable = false;
  return o;
}

}  // namespace

TEST_CASE("write_whole publishes every file and leaves no scratch", "[exec][parted]") {
  fs::path dir = fresh_dir("whole");
  TwoFiles w(dir);
  Published done = write_whole(w, options_for(dir));
  CHECK(done.files == w.destinations());
  CHECK(w.runs == 1);
  CHECK(names_in(dir) == std::vector<std::string>{"a.bin", "b.bin"});
  CHECK(read_all(dir / "a.bin") == kFileA);
  CHECK(read_all(dir / "b.bin") == kFileB);
  fs::remove_all(dir);
}

TEST_CASE("write_whole leaves nothing when the writer fails half way", "[exec][parted]") {
  fs::path dir = fresh_dir("fails");
  TwoFiles w(dir);
  w.after_first = [] { fail(ErrorCode::kDataLoss, "source truncated"); };
  CHECK_THROWS_WITH(write_whole(w, options_for(dir)), Catch::Contains("source truncated"));
  CHECK(names_in(dir).empty());  // neither file, nor the scratch folder
  fs::remove_all(dir);
}

TEST_CASE("write_whole refuses an output that exists, before writing anything", "[exec][parted]") {
  fs::path dir = fresh_dir("exists");
  std::ofstream(dir / "b.bin") << "keep me";
  TwoFiles w(dir);
  CHECK_THROWS_WITH(write_whole(w, options_for(dir)), Catch::Contains("b.bin: output exists"));
  CHECK(w.runs == 0);
  CHECK(names_in(dir) == std::vector<std::string>{"b.bin"});
  CHECK(read_all(dir / "b.bin") == "keep me");

  PartedOptions force = options_for(dir);
  force.force = true;
  write_whole(w, force);
  CHECK(read_all(dir / "b.bin") == kFileB);
  CHECK(names_in(dir) == std::vector<std::string>{"a.bin", "b.bin"});
  fs::remove_all(dir);
}

TEST_CASE("write_whole never replaces a file that appears while it runs", "[exec][parted]") {
  fs::path dir = fresh_dir("appears");
  TwoFiles w(dir);
  w.after_first = [&] { std::ofstream(dir / "b.bin") << "written meanwhile"; };
  CHECK_THROWS_WITH(write_whole(w, options_for(dir)), Catch::Contains("b.bin: output exists"));
  // All or none: a.bin, renamed first, is taken back; b.bin is the other writer's.
  CHECK(names_in(dir) == std::vector<std::string>{"b.bin"});
  CHECK(read_all(dir / "b.bin") == "written meanwhile");
  fs::remove_all(dir);
}

TEST_CASE("write_parted's parts give write_whole's bytes", "[exec][parted]") {
  for (int n : {1, 2, 3}) {
    INFO("parts: " << n);
    fs::path dir = fresh_dir("parts" + std::to_string(n));
    TwoFiles w(dir);
    PartOutcome last;
    for (int i = 0; i < n; ++i) last = write_parted(w, options_for(dir), {i, n, false, "test"});
    CHECK(last.published);
    CHECK(names_in(dir) == std::vector<std::string>{"a.bin", "b.bin"});  // the parts folder is gone
    CHECK(read_all(dir / "a.bin") == kFileA);
    CHECK(read_all(dir / "b.bin") == kFileB);
    fs::remove_all(dir);
  }
}
