#include "formats/hdf5/hdf5_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "formats/hdf5/hdf5_attributes.h"
#include "formats/hdf5/hdf5_handle.h"
#include "formats/hdf5/hdf5_types.h"
#include "io/part_sink.h"
#include "model/tree_walk.h"
#include "model/value_json.h"

namespace ckpt::hdf5 {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr uint64_t kChunkBytes = 1u << 20;  // target size of one HDF5 chunk
constexpr uint64_t kCopyBuffer = 8u << 20;  // bytes read per step by DatasetSink::copy_from

// Appends n bytes of src at pos to `sink` through a bounded buffer, read
// with pread when the source is a file (ByteSource::read_unmapped): writing
// straight from a mapped source would touch every page of it and grow the
// resident set with the checkpoint.
void copy_through_buffer(ByteSink& sink, const ByteSource& src, uint64_t pos, uint64_t n) {
  std::vector<char> buf(static_cast<std::size_t>(std::min(n, kCopyBuffer)));
  while (n > 0) {
    std::size_t step = static_cast<std::size_t>(std::min<uint64_t>(n, buf.size()));
    src.read_unmapped(pos, buf.data(), step);
    sink.write(buf.data(), step);
    pos += step;
    n -= step;
  }
}

// Receives a tensor's row-major bytes and writes them as dim-0 hyperslabs:
// whole rows straight from the caller's buffer, a row split across calls
// through a one-row buffer.
class DatasetSink final : public ByteSink {
 public:
  DatasetSink(hid_t dataset, hid_t type, const Shape& shape, std::size_t itemsize, std::string what)
      : dataset_(dataset), type_(type), shape_(shape), what_(std::move(what)) {
    Shape row(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
    row_bytes_ = shape_numel(row) * itemsize;
    rows_ = shape.empty() ? 1 : shape[0];
  }

  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    const char* p = static_cast<const char*>(data);
    position_ += n;
    if (row_bytes_ == 0) return;
    if (!partial_.empty()) {
      std::size_t take = std::min<std::size_t>(n, row_bytes_ - partial_.size());
      partial_.insert(partial_.end(), p, p + take);
      p += take;
      n -= take;
      if (partial_.size() == row_bytes_) {
        write_rows(partial_.data(), 1);
        partial_.clear();
      }
    }
    if (uint64_t whole = n / row_bytes_; whole > 0) {
      write_rows(p, whole);
      p += whole * row_bytes_;
      n -= whole * row_bytes_;
    }
    partial_.insert(partial_.end(), p, p + n);
  }
  uint64_t position() const override { return position_; }

  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override {
    if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
    copy_through_buffer(*this, src, pos, n);
  }

  void finish() {
    if (!partial_.empty() || written_ != (row_bytes_ == 0 ? written_ : static_cast<uint64_t>(rows_)))
      fail(ErrorCode::kInternal, what_ + ": dataset received " + std::to_string(position_) + " bytes, not whole rows");
  }

 private:
  void write_rows(const void* data, uint64_t count) {
    if (written_ + count > static_cast<uint64_t>(rows_))
      fail(ErrorCode::kInternal, what_ + ": more rows than the dataset has");
    if (shape_.empty()) {
      check(H5Dwrite(dataset_, type_, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), ErrorCode::kOutputFailed, what_);
      written_ = 1;
      return;
    }
    std::vector<hsize_t> start(shape_.size(), 0), dims(shape_.begin(), shape_.end());
    start[0] = written_;
    dims[0] = count;
    Handle file_space = checked_handle(H5Dget_space(dataset_), ErrorCode::kOutputFailed, what_);
    check(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, dims.data(), nullptr),
          ErrorCode::kOutputFailed, what_);
    Handle mem_space = checked_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                      ErrorCode::kOutputFailed, what_);
    check(H5Dwrite(dataset_, type_, mem_space, file_space, H5P_DEFAULT, data), ErrorCode::kOutputFailed, what_);
    written_ += count;
  }

  hid_t dataset_, type_;
  Shape shape_;
  std::string what_;
  uint64_t row_bytes_ = 0;
  int64_t rows_ = 0;
  uint64_t written_ = 0, position_ = 0;
  std::vector<char> partial_;
};

bool is_container(const Value& v) {
  return v.is(Kind::kDict) || v.is(Kind::kList) || v.is(Kind::kTuple) ||
         (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict));
}

// A list or tuple becomes a group when it holds containers or tensors, as in
// model/tree_walk (a list of plain values is one JSON value).
bool is_group(const Value& v) {
  if (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict)) return true;
  if (v.is(Kind::kDict)) return true;
  if (!v.is(Kind::kList) && !v.is(Kind::kTuple)) return false;
  return std::any_of(v.items.begin(), v.items.end(),
                     [](const pickle::ValuePtr& i) { return is_container(*i) || tensor_ref_index(*i); });
}

class Hdf5Writer {
 public:
  Hdf5Writer(const CheckpointModel& model, const WriteOptions& options, const FillTensor& fill)
      : model_(model), options_(options), fill_(fill), paths_(model.tensors.size()) {}

  void write_group(hid_t group, const Value& v, const std::string& path) {
    const Value& c = v.is(Kind::kBuilt) ? *v.object : v;
    nlohmann::ordered_json keys = nlohmann::ordered_json::array();
    write_string_attribute(group, "ckptconv.kind", c.is(Kind::kDict) ? "dict" : c.is(Kind::kList) ? "list" : "tuple");
    if (c.is(Kind::kDict)) {
      for (const auto& [k, child] : c.entries) {
        if (k->is(Kind::kInt))
          keys.push_back(k->int_value);
        else
          keys.push_back(path_component(*k));
        write_child(group, path_component(*k), *child, join_path(path, path_component(*k)));
      }
    } else {
      for (std::size_t i = 0; i < c.items.size(); ++i)
        write_child(group, std::to_string(i), *c.items[i], join_path(path, std::to_string(i)));
    }
    if (c.is(Kind::kDict))
      write_string_attribute(group, "ckptconv.keys", keys.dump());
    else
      write_int_attribute(group, "ckptconv.length", static_cast<int64_t>(c.items.size()));
  }

 private:
  void write_child(hid_t group, const std::string& key, const Value& child, const std::string& path) {
    std::string name = escape_name(key);
    std::string what = "'" + (path.empty() ? std::string("/") : path) + "'";
    if (auto idx = tensor_ref_index(child)) {
      write_tensor(group, name, *idx, what);
    } else if (is_group(child)) {
      Handle gcpl = checked_handle(H5Pcreate(H5P_GROUP_CREATE), ErrorCode::kInternal, "group " + what);
      check(H5Pset_obj_track_times(gcpl, false), ErrorCode::kOutputFailed, "group " + what);  // see write_tensor
      Handle g = checked_handle(H5Gcreate2(group, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT),
                                ErrorCode::kOutputFailed, "group " + what);
      write_group(g, child, path);
    } else {
      with_context("value " + what, [&] { write_string_attribute(group, name, value_to_json(child).dump()); });
    }
  }

  void write_tensor(hid_t group, const std::string& name, std::size_t index, const std::string& what) {
    const TensorEntry& t = model_.tensors.at(index);
    if (!paths_[index].empty()) {
      // The same tensor reached again: a hard link to the first dataset.
      check(H5Lcreate_hard(file_, paths_[index].c_str(), group, name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
            ErrorCode::kOutputFailed, "dataset " + what);
      return;
    }
    std::string ds_what = "dataset " + what;
    DType d = t.output_dtype();
    Handle type = hdf5_type_for(d);
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    Handle space = checked_handle(
        t.shape.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
        ErrorCode::kOutputFailed, ds_what);
    Handle dcpl = checked_handle(H5Pcreate(H5P_DATASET_CREATE), ErrorCode::kInternal, ds_what);
    // No modification times in object headers: the same checkpoint gives the
    // same bytes whenever it is written (a run straddling a second did not).
    check(H5Pset_obj_track_times(dcpl, false), ErrorCode::kOutputFailed, ds_what);
    // Uncompressed: one contiguous extent, allocated now and never filled,
    // which we write ourselves (RawRangeSink). Element bytes are the
    // tensor's own (little-endian, the dtype's size), so they go unchanged.
    bool raw = !options_.gzip && t.numel() > 0 && H5Tget_size(type) == dtype_size(d);
    if (raw) {
      check(H5Pset_layout(dcpl, H5D_CONTIGUOUS), ErrorCode::kOutputFailed, ds_what);
      check(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), ErrorCode::kOutputFailed, ds_what);
      check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), ErrorCode::kOutputFailed, ds_what);
    } else if (!t.shape.empty() && t.numel() > 0) {
      // Chunks of whole rows (at least one), about kChunkBytes each.
      std::vector<hsize_t> chunk = dims;
      uint64_t row_bytes = t.numel() / dims[0] * dtype_size(d);
      chunk[0] = std::clamp<hsize_t>(kChunkBytes / std::max<uint64_t>(row_bytes, 1), 1, dims[0]);
      check(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), ErrorCode::kOutputFailed, ds_what);
      if (options_.gzip) {
        check(H5Pset_shuffle(dcpl), ErrorCode::kOutputFailed, ds_what);
        check(H5Pset_deflate(dcpl, static_cast<unsigned>(options_.gzip_level)), ErrorCode::kOutputFailed, ds_what);
      }
    }
    Handle ds = checked_handle(H5Dcreate2(group, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                               ErrorCode::kOutputFailed, ds_what);
    write_string_attribute(ds, "dtype", std::string(dtype_name(d)));
    haddr_t offset = raw ? H5Dget_offset(ds) : HADDR_UNDEF;
    if (offset != HADDR_UNDEF) {
      // The bytes go straight into the space libhdf5 allocated for them
      // (pwrite; copy_file_range for bytes that pass unchanged), so an
      // uncompressed HDF5 output costs what a .pt does. libhdf5 never
      // touches that space again: allocated at creation, never filled
      // (H5D_FILL_TIME_NEVER); the library writes only metadata, elsewhere.
      uint64_t n = t.numel() * dtype_size(d);
      PartSink sink(raw_fd(), {{offset, offset + n}}, ds_what, offset, options_.stream);
      fill_(index, sink);
      if (sink.position() != offset + n)
        fail(ErrorCode::kInternal, ds_what + ": dataset received " + std::to_string(sink.position() - offset) + " of " +
                                       std::to_string(n) + " bytes");
    } else {
      DatasetSink sink(ds, type, t.shape, dtype_size(d), ds_what);
      fill_(index, sink);
      sink.finish();
    }
    paths_[index] = object_path(ds);
  }

  static std::string object_path(hid_t object) {
    ssize_t n = H5Iget_name(object, nullptr, 0);
    std::string out(static_cast<std::size_t>(std::max<ssize_t>(n, 0)), '\0');
    H5Iget_name(object, out.data(), out.size() + 1);
    return out;
  }

 public:
  hid_t file_ = H5I_INVALID_HID;
  std::string path_;  // of the file, for our own descriptor on it

  ~Hdf5Writer() {
    if (raw_fd_ >= 0) ::close(raw_fd_);
  }

 private:
  const CheckpointModel& model_;
  const WriteOptions& options_;
  const FillTensor& fill_;
  std::vector<std::string> paths_;  // first dataset of each tensor
  int raw_fd_ = -1;

  int raw_fd() {
    if (raw_fd_ < 0) {
      raw_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
      if (raw_fd_ < 0) fail(ErrorCode::kOutputFailed, path_ + ": cannot open for writing: " + std::strerror(errno));
    }
    return raw_fd_;
  }
};

void write_root_attributes(hid_t root, const CheckpointModel& model) {
  write_int_attribute(root, "ckptconv.layout_version", kLayoutVersion);
  write_string_attribute(root, "ckptconv.version", CKPT_VERSION);
  write_string_attribute(root, "ckptconv.source_format", model.format());
  int world_size = -1;
  for (const auto& t : model.tensors) world_size = std::max(world_size, t.world_size);
  // Else the source's (the ranks that wrote it, as its reader counted them).
  if (world_size < 0)
    for (int ws : model.info.world_sizes) world_size = std::max(world_size, ws);
  if (world_size > 0) write_int_attribute(root, "ckptconv.world_size", world_size);
  nlohmann::ordered_json facts = nlohmann::ordered_json::object();
  for (const auto& [k, v] : model.facts) facts[k] = v;
  write_string_attribute(root, "ckptconv.facts", facts.dump());
}

}  // namespace

void write_hdf5(const std::string& path, const CheckpointModel& model, const WriteOptions& options,
                const FillTensor& fill) {
  silence_hdf5_errors();
  require_distinct_paths(*model.root, "an HDF5 file");
  // What the input holds, not how it was asked for: exit 3, as for any input the output cannot take.
  if (!is_group(*model.root))
    fail(ErrorCode::kUnimplemented,
         "HDF5 output needs a dict or list at the top of the checkpoint (this one holds " +
             (tensor_ref_index(*model.root) ? std::string("a tensor")
                                            : "a " + std::string(pickle::kind_name(model.root->kind))) +
             "); write .pt or .safetensors instead");
  // The file is our temporary output, already flock'ed by its sink for this
  // run (io/temp_output.h): libhdf5's own lock on it would conflict.
  Handle fapl = checked_handle(H5Pcreate(H5P_FILE_ACCESS), ErrorCode::kOutputFailed, "file access list");
  check(H5Pset_file_locking(fapl, false, true), ErrorCode::kOutputFailed, "file locking");
  // Datasets of 64 KiB or more start on a 4 KiB boundary: whole pages for
  // the kernel to move (copy_file_range), as in the .pt writer's records.
  check(H5Pset_alignment(fapl, 64u << 10, 4096), ErrorCode::kOutputFailed, "alignment");
  Handle file = checked_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), ErrorCode::kOutputFailed,
                               "cannot create HDF5 file");
  Handle root = checked_handle(H5Gopen2(file, "/", H5P_DEFAULT), ErrorCode::kOutputFailed, "root group");
  write_root_attributes(root, model);
  Hdf5Writer writer(model, options, fill);
  writer.file_ = file;
  writer.path_ = path;
  writer.write_group(root, *model.root, "");
  root.reset();
  check(H5Fflush(file, H5F_SCOPE_GLOBAL), ErrorCode::kOutputFailed, "flush");
  check(file.reset(), ErrorCode::kOutputFailed, "close");
}

}  // namespace ckpt::hdf5
