#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/temp_output.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckpt_atomic_dir_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("an atomic directory appears only when committed", "[io][atomic_dir]") {
  fs::path base = fresh_dir("commit");
  std::string dst = (base / "out").string();
  {
    AtomicDirectory dir(dst + "/", false);  // a trailing slash names the same directory
    write_file(dir.path_of("a.pt"), "x");
    CHECK_FALSE(fs::exists(dst));
    CHECK(fs::exists(dir.temp_dir() + "/a.pt"));
    dir.commit();
  }
  CHECK(names_in(base) == std::vector<std::string>{"out"});
  CHECK(names_in(dst) == std::vector<std::string>{"a.pt"});
  fs::remove_all(base);
}

TEST_CASE("an uncommitted atomic directory leaves nothing", "[io][atomic_dir]") {
  fs::path base = fresh_dir("abandon");
  {
    AtomicDirectory dir((base / "out").string(), false);
    write_file(dir.path_of("a.pt"), "x");
  }
  CHECK(names_in(base).empty());
  fs::remove_all(base);
}

TEST_CASE("an existing output is refused without force and replaced with it", "[io][atomic_dir]") {
  fs::path base = fresh_dir("force");
  fs::path dst = base / "out";
  fs::create_directories(dst);
  write_file((dst / "old").string(), "keep");
  CHECK_THROWS_AS(AtomicDirectory(dst.string(), false), Error);
  CHECK(names_in(base) == std::vector<std::string>{"out"});
  {
    AtomicDirectory dir(dst.string(), true);
    write_file(dir.path_of("new"), "x");
    dir.commit();
  }
  CHECK(names_in(base) == std::vector<std::string>{"out"});  // the old output is gone, no temporary left
  CHECK(names_in(dst) == std::vector<std::string>{"new"});
  fs::remove_all(base);
}

TEST_CASE("temporary names fit NAME_MAX however long the destination's name", "[io]") {
  const std::string dir = "/some/dir/";
  CHECK(temp_prefix(dir + "model.pt") == dir + "model.pt.tmp-");
  CHECK(temp_prefix("model.pt") == "model.pt.tmp-");
  std::string long_a(249, 'a'), long_b = std::string(240, 'a') + "bbbbbbbbb";
  std::string pa = temp_prefix(dir + long_a), pb = temp_prefix(dir + long_b);
  CHECK(pa.size() - dir.size() + 6 == 255);  // the cut name, "~" + 16 hex, ".tmp-", XXXXXX
  CHECK(pa != pb);                           // same cut, different names: different hashes
  CHECK(pa == temp_prefix(dir + long_a));    // and the same name always gives the same prefix
  std::string fits(244, 'c');                // 244 + ".tmp-" + 6 = 255: kept as is
  CHECK(temp_prefix(fits) == fits + ".tmp-");
}
