#ifdef CKPT_HAVE_HDF5
#include "formats/hdf5/hdf5_reader.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "formats/hdf5/hdf5_writer.h"

using namespace ckpt;

namespace {

// A .h5 of one float32 tensor 'w' of n elements, all `value`.
std::string write_one_tensor(const std::string& path, std::size_t n, float value) {
  CheckpointModel m;
  TensorEntry t;
  t.name = "w";
  t.shape = {static_cast<int64_t>(n)};
  m.tensors.push_back(t);
  m.root = pickle::Value::dict({{pickle::Value::str("w"), make_tensor_ref(0)}});
  hdf5::write_hdf5(path, m, {}, [&](std::size_t, ByteSink& sink) {
    std::vector<float> v(n, value);
    sink.write(v.data(), v.size() * sizeof(float));
  });
  return path;
}

}  // namespace

TEST_CASE("hdf5 reader: the bytes come from the child, and a file changed meanwhile is refused, not read as zeros") {
  auto dir = std::filesystem::temp_directory_path() / ("ckpt-h5-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = write_one_tensor((dir / "m.h5").string(), 1 << 16, 1.5f);
  CheckpointModel model = hdf5::read_hdf5_file(path);
  REQUIRE(model.tensors.size() == 1);
  const ByteSource& w = *model.tensors[0].chunks.front().storage;
  float got[4] = {};
  w.read(1000, got, sizeof got);
  CHECK(got[0] == 1.5f);
  CHECK(got[3] == 1.5f);
  CHECK_THAT(w.describe(), Catch::Contains("m.h5") && Catch::Contains("dataset 'w'"));
  // Truncated while the job runs: libhdf5 would read the missing bytes as zeros.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  try {
    w.read(200000, got, sizeof got);
    FAIL("read a truncated file: " << got[0]);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK_THAT(e.what(), Catch::Contains("changed while it was read"));
  }
  std::filesystem::remove_all(dir);
}
#endif
