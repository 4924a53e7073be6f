#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "io/parts_folder.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckpt_parts_folder_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The code of the error fn throws; kInternal when it throws none.
ErrorCode code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("a parts folder is made, reopened, and its files created and read", "[io][parts_folder]") {
  fs::path base = fresh_dir("plain");
  std::string dir = (base / "out.pt.parts-1").string();
  CHECK_FALSE(PartsFolder::open(dir).has_value());
  PartsFolder made = PartsFolder::create(dir);
  PartsFolder again = PartsFolder::create(dir);  // a sibling worker's
  int fd = made.open_file("data-0", true);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "abc", 3) == 3);
  ::close(fd);
  CHECK(again.read_file("data-0") == std::optional<std::string>("abc"));
  CHECK(again.open_file("data-1", false) == -1);
  CHECK_FALSE(again.read_file("absent").has_value());
  CHECK(made.create_exclusive("finalizing"));
  CHECK_FALSE(again.create_exclusive("finalizing"));
  CHECK(errno == EEXIST);
  fs::remove_all(base);
}

TEST_CASE("a parts folder that is a link is refused, and the link's target untouched", "[io][parts_folder]") {
  fs::path base = fresh_dir("linked");
  fs::create_directories(base / "elsewhere");
  fs::create_directory_symlink(base / "elsewhere", base / "out.pt.parts-1");
  std::string dir = (base / "out.pt.parts-1").string();
  CHECK(code_of([&] { PartsFolder::create(dir); }) == ErrorCode::kUnsafe);
  CHECK(code_of([&] { PartsFolder::open(dir); }) == ErrorCode::kUnsafe);
  CHECK(fs::is_empty(base / "elsewhere"));
  std::ofstream(base / "file") << "x";
  CHECK(code_of([&] { PartsFolder::create((base / "file").string()); }) == ErrorCode::kUnsafe);
  fs::remove_all(base);
}

TEST_CASE("a parts folder's entries are refused unless regular files with one link", "[io][parts_folder]") {
  fs::path base = fresh_dir("entries");
  std::ofstream(base / "input.distcp") << "input bytes";
  PartsFolder folder = PartsFolder::create((base / "parts").string());
  fs::create_symlink(base / "input.distcp", base / "parts" / "data-0");
  fs::create_hard_link(base / "input.distcp", base / "parts" / "data-1");
  fs::create_directory(base / "parts" / "data-2");
  REQUIRE(::mkfifo((base / "parts" / "data-3").c_str(), 0644) == 0);
  for (const char* name : {"data-0", "data-1", "data-2", "data-3"}) {
    INFO(name);
    CHECK(code_of([&] { folder.open_file(name, true); }) == ErrorCode::kUnsafe);
    CHECK(code_of([&] { folder.read_file(name); }) == ErrorCode::kUnsafe);
  }
  // A planted link also keeps create_exclusive from creating through it.
  fs::create_symlink(base / "victim", base / "parts" / "finalizing");
  CHECK_FALSE(folder.create_exclusive("finalizing"));
  CHECK_FALSE(fs::exists(base / "victim"));
  CHECK(read_all(base / "input.distcp") == "input bytes");
  fs::remove_all(base);
}
