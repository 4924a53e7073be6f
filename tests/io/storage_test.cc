#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/containment.h"
#include "io/storage.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckpt_storage_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }
}  // namespace

TEST_CASE("stat tells files, directories, links and missing names apart", "[io][storage]") {
  fs::path d = fresh_dir("stat");
  write(d / "f", "12345");
  fs::create_directory(d / "sub");
  fs::create_symlink(d / "f", d / "to_f");
  fs::create_symlink(d / "nowhere", d / "dangling");

  EntryStat f = stat_path((d / "f").string());
  CHECK(f.is_file());
  CHECK(f.size == 5);
  CHECK_FALSE(f.link);
  CHECK(stat_path((d / "sub").string()).is_directory());
  EntryStat l = stat_path((d / "to_f").string());
  CHECK(l.is_file());
  CHECK(l.link);
  CHECK(l.device == f.device);
  CHECK(l.inode == f.inode);  // one file, two names
  EntryStat dangling = stat_path((d / "dangling").string());
  CHECK(dangling.exists());                  // the name is there ...
  CHECK(dangling.kind == EntryKind::kNone);  // ... and names nothing
  CHECK_FALSE(path_exists((d / "missing").string()));
  CHECK_FALSE(path_exists(""));
  fs::remove_all(d);
}

TEST_CASE("listing is sorted, joined to the directory, and empty for a non-directory", "[io][storage]") {
  fs::path d = fresh_dir("list");
  for (const char* n : {"b", "a", "__1_0.distcp", "Z"}) write(d / n, n);
  fs::create_directory(d / "dir");
  std::vector<DirEntry> entries = list_directory(d.string() + "/");
  REQUIRE(entries.size() == 5);
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"Z", "__1_0.distcp", "a", "b", "dir"});
  CHECK(entries[2].path == d.string() + "/a");
  CHECK(entries[2].is_file());
  CHECK(entries[4].is_directory());
  CHECK(list_directory((d / "a").string()).empty());
  CHECK(list_directory((d / "missing").string()).empty());
  CHECK_FALSE(is_empty_directory(d.string()));
  fs::create_directory(d / "empty");
  CHECK(is_empty_directory((d / "empty").string()));
  fs::remove_all(d);
}

TEST_CASE("small files are read whole, and a large one is refused by name", "[io][storage]") {
  fs::path d = fresh_dir("small");
  write(d / "latest", "global_step7\n");
  CHECK(read_small_file((d / "latest").string(), 64) == "global_step7\n");
  try {
    read_small_file((d / "latest").string(), 4);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("latest") && Catch::Contains("13 bytes"));
  }
  CHECK_THROWS_AS(read_small_file((d / "missing").string(), 4), Error);
  fs::remove_all(d);
}

TEST_CASE("every open through the storage applies the containment rule", "[io][storage]") {
  fs::path outside = fresh_dir("outside");
  fs::path d = fresh_dir("contained");
  write(outside / "secret", "do not read");
  fs::create_symlink(outside / "secret", d / "shard.safetensors");
  add_checkpoint_root(d.string());
  try {
    storage_for(d.string()).open((d / "shard.safetensors").string(), false);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsafe);
    CHECK_THAT(e.what(), Catch::Contains("shard.safetensors"));
  }
  CHECK_THROWS_AS(read_small_file((d / "shard.safetensors").string(), 100), Error);
  fs::remove_all(d);
  fs::remove_all(outside);
}

TEST_CASE("outputs: directories made once, links copied as links, files linked or copied", "[io][storage]") {
  fs::path d = fresh_dir("out");
  const Storage& s = storage_for(d.string());
  CHECK(s.make_directory((d / "o").string()));
  CHECK_FALSE(s.make_directory((d / "o").string()));
  write(d / "file", "x");
  CHECK_THROWS_AS(s.make_directory((d / "file").string()), Error);
  s.link_or_copy((d / "file").string(), (d / "o" / "copy").string());
  CHECK(stat_path((d / "o" / "copy").string()).inode == stat_path((d / "file").string()).inode);
  fs::create_symlink("file", d / "rel");
  s.copy_link((d / "rel").string(), (d / "o" / "rel").string());
  CHECK(fs::read_symlink(d / "o" / "rel") == "file");
  CHECK(s.resolved((d / "o" / ".." / "file").string()) == fs::canonical(d / "file").string());
  s.remove_tree((d / "o").string());
  CHECK_FALSE(path_exists((d / "o").string()));
  CHECK(s.remove((d / "file").string()));
  CHECK_FALSE(s.remove((d / "file").string()));
  fs::remove_all(d);
}
