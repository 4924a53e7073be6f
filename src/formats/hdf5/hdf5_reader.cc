#include "formats/hdf5/hdf5_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/budgets.h"
#include "core/checked.h"
#include "formats/hdf5/hdf5_attributes.h"
#include "formats/hdf5/hdf5_handle.h"
#include "formats/hdf5/hdf5_structure.h"
#include "io/isolate.h"
#include "io/storage.h"
#include "model/ordered_json.h"
#include "model/tree_walk.h"
#include "model/validate.h"
#include "model/value_json.h"

namespace ckpt::hdf5 {
namespace {

using Json = nlohmann::ordered_json;
using pickle::Value;
using pickle::ValuePtr;

constexpr int kMaxDepth = 200;
// deflate's largest expansion is about 1032:1; a chunked dataset that
// declares more bytes than that from its stored chunks is not one ckptconv
// wrote (it never leaves chunks unallocated), and reading it would make up
// terabytes of fill values.
constexpr uint64_t kMaxInflation = 1100;

// A dataset's bytes in row-major order, read through HDF5 a range of dim-0
// rows at a time (HDF5 decompresses and converts nothing: the memory type is
// the file type). The dataset is opened, by its object address, only while
// rows are read: libhdf5 keeps about 15 KB per open dataset, and a source
// per tensor held open made 100,000 datasets cost 1.5 GB before a byte was read.
class DatasetSource final : public ByteSource {
 public:
  DatasetSource(std::shared_ptr<const Handle> file, haddr_t address, Shape shape, std::size_t itemsize,
                std::string name)
      : file_(std::move(file)), address_(address), shape_(std::move(shape)), name_(std::move(name)) {
    Shape row(shape_.begin() + (shape_.empty() ? 0 : 1), shape_.end());
    row_bytes_ = shape_numel(row) * itemsize;
    size_ = shape_numel(shape_) * itemsize;
  }

  uint64_t size() const override { return size_; }
  std::string describe() const override { return name_; }

  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n == 0) return;
    uint64_t r0 = pos / row_bytes_, r1 = (pos + n + row_bytes_ - 1) / row_bytes_;
    if (pos % row_bytes_ == 0 && n % row_bytes_ == 0) return read_rows(r0, r1 - r0, buf);  // whole rows: in place
    std::vector<char> rows(static_cast<std::size_t>((r1 - r0) * row_bytes_));
    read_rows(r0, r1 - r0, rows.data());
    std::memcpy(buf, rows.data() + (pos - r0 * row_bytes_), n);
  }

 private:
  void read_rows(uint64_t first, uint64_t count, void* out) const {
    Handle dataset = checked_handle(H5Oopen_by_addr(*file_, address_), ErrorCode::kDataLoss, name_);
    Handle type = checked_handle(H5Dget_type(dataset), ErrorCode::kDataLoss, name_);
    if (shape_.empty()) {
      check(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out), ErrorCode::kDataLoss, name_);
      return;
    }
    std::vector<hsize_t> start(shape_.size(), 0), dims(shape_.begin(), shape_.end());
    start[0] = first;
    dims[0] = count;
    Handle file_space = checked_handle(H5Dget_space(dataset), ErrorCode::kDataLoss, name_);
    check(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, dims.data(), nullptr),
          ErrorCode::kDataLoss, name_);
    Handle mem_space = checked_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                      ErrorCode::kDataLoss, name_);
    check(H5Dread(dataset, type, mem_space, file_space, H5P_DEFAULT, out), ErrorCode::kDataLoss, name_);
  }

  std::shared_ptr<const Handle> file_;
  haddr_t address_;
  Shape shape_;
  std::string name_;
  uint64_t row_bytes_ = 0, size_ = 0;
};

class Hdf5Reader {
 public:
  Hdf5Reader(std::string path, std::shared_ptr<const Handle> file, CheckpointModel& model, uint64_t file_size)
      : path_(std::move(path)), file_(std::move(file)), model_(model), file_size_(file_size) {}

  ValuePtr read_group(hid_t group, const std::string& path, int depth) {
    if (depth > kMaxDepth) fail_data_loss("groups nest too deeply");
    std::string where = path.empty() ? "/" : path;
    auto kind = read_string_attribute(group, "ckptconv.kind");
    if (!kind) fail_data_loss("group '" + where + "' has no ckptconv.kind attribute");
    if (*kind == "dict") {
      auto keys_text = read_string_attribute(group, "ckptconv.keys");
      Json keys = parse_checkpoint_json(keys_text.value_or(""), "group '" + where + "': ckptconv.keys");
      if (!keys.is_array()) fail_data_loss("group '" + where + "': ckptconv.keys is not a JSON array");
      std::vector<std::pair<ValuePtr, ValuePtr>> entries;
      std::set<std::string> seen;  // a dict has each key once: the writer never repeats one
      for (const auto& k : keys) {
        if (!k.is_string() && !k.is_number_integer())
          fail_data_loss("group '" + where + "': a key is neither str nor int");
        if (!seen.insert(k.dump()).second)
          fail_data_loss("group '" + where + "': ckptconv.keys lists the key " + k.dump().substr(0, 64) + " twice");
        ValuePtr key = k.is_string() ? Value::str(k.get<std::string>()) : Value::integer(k.get<int64_t>());
        std::string component = path_component(*key);
        entries.emplace_back(key, read_child(group, component, join_path(path, component), depth));
      }
      return Value::dict(std::move(entries));
    }
    if (*kind != "list" && *kind != "tuple")
      fail_data_loss("group '" + where + "': unknown ckptconv.kind '" + *kind + "'");
    auto length = read_int_attribute(group, "ckptconv.length");
    if (!length || *length < 0) fail_data_loss("group '" + where + "' has no ckptconv.length attribute");
    std::vector<ValuePtr> items;
    for (int64_t i = 0; i < *length; ++i)
      items.push_back(read_child(group, std::to_string(i), join_path(path, std::to_string(i)), depth));
    return *kind == "list" ? Value::list(std::move(items)) : Value::tuple(std::move(items));
  }

 private:
  ValuePtr read_child(hid_t group, const std::string& key, const std::string& path, int depth) {
    std::string name = escape_name(key);
    if (check(H5Lexists(group, name.c_str(), H5P_DEFAULT), ErrorCode::kDataLoss, "'" + path + "'") > 0) {
      refuse_external_link(group, name, path);
      H5O_info_t info;
      check(H5Oget_info_by_name(group, name.c_str(), &info, H5P_DEFAULT), ErrorCode::kDataLoss, "'" + path + "'");
      if (info.type == H5O_TYPE_GROUP) {
        // Hard links to one group are one value, read once: a file whose
        // groups link twice to the next level, 40 levels deep, is 40 groups,
        // not 2^40 (read_checkpoint then bounds the tree they expand to).
        if (auto done = groups_.find(info.addr); done != groups_.end()) {
          if (!done->second)
            fail_data_loss("group '" + path + "' is a hard link to a group that contains it (a cycle)");
          return done->second;
        }
        groups_.emplace(info.addr, nullptr);  // in progress
        Handle g =
            checked_handle(H5Gopen2(group, name.c_str(), H5P_DEFAULT), ErrorCode::kDataLoss, "group '" + path + "'");
        ValuePtr value = read_group(g, path, depth + 1);
        groups_[info.addr] = value;
        return value;
      }
      if (info.type != H5O_TYPE_DATASET) fail_data_loss("'" + path + "' is neither a group nor a dataset");
      // Hard links to one dataset are one tensor.
      auto [it, fresh] = by_address_.emplace(info.addr, model_.tensors.size());
      if (fresh) read_dataset(group, name, path, info.addr);
      return make_tensor_ref(it->second);
    }
    auto text = read_string_attribute(group, name);
    if (!text) fail_data_loss("'" + path + "' is listed but has no dataset, group or attribute");
    Json j = parse_checkpoint_json(*text, "value '" + path + "'");
    return value_from_json(j, [&](const Json&) -> ValuePtr { fail_data_loss("value '" + path + "' names a tensor"); });
  }

  // An external link opens another file, wherever it names: ckptconv never
  // writes one, and following it would read outside the input.
  static void refuse_external_link(hid_t group, const std::string& name, const std::string& path) {
    H5L_info_t link;
    check(H5Lget_info(group, name.c_str(), &link, H5P_DEFAULT), ErrorCode::kDataLoss, "'" + path + "'");
    if (link.type == H5L_TYPE_EXTERNAL && !input_budgets().follow_links) {
      fail(ErrorCode::kUnsafe, "'" + path +
                                   "' is an HDF5 external link to another file; refused (--follow-links reads it "
                                   "for trusted input)");
    }
  }

  // The bytes a dataset declares must be ones the file holds: a contiguous
  // dataset's extent lies inside the file, a chunked one's stored chunks
  // inflate to at most kMaxInflation times their size. H5Dget_storage_size
  // walks the chunk index, so the isolated pass checks that index too.
  void check_declared_size(hid_t ds, const std::string& what, uint64_t declared) const {
    Handle dcpl = checked_handle(H5Dget_create_plist(ds), ErrorCode::kDataLoss, what);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    hsize_t stored = H5Dget_storage_size(ds);
    // A contiguous dataset stores exactly its extent's bytes (newer libhdf5
    // refuses anything else as "invalid dataset size"; 1.10 reads a flipped
    // dimension of 4 -> 0 as an empty tensor).
    if (layout == H5D_CONTIGUOUS && stored != 0 && stored != declared)
      fail_data_loss(what + " declares " + std::to_string(declared) + " bytes but stores " + std::to_string(stored) +
                     " (a corrupt dataspace or layout)");
    if (declared == 0) return;
    if (layout == H5D_CONTIGUOUS) {
      haddr_t offset = H5Dget_offset(ds);
      if (offset == HADDR_UNDEF || offset > file_size_ || declared > file_size_ - offset)
        fail_data_loss(what + " declares " + std::to_string(declared) + " bytes that the file (" +
                       std::to_string(file_size_) + " bytes) does not hold");
    } else if (layout == H5D_CHUNKED) {
      if (stored == 0 || declared / kMaxInflation > stored)
        fail_data_loss(what + " declares " + std::to_string(declared) + " bytes from " + std::to_string(stored) +
                       " stored (unallocated or corrupt chunks)");
    } else if (layout != H5D_COMPACT) {
      fail_data_loss(what + " has a storage layout ckptconv does not write (virtual or unknown)");
    }
  }

  // A chunked dataset's index names every chunk once, at a coordinate on
  // the chunk grid inside the extent, with bytes inside the file: the way
  // ckptconv writes it (every chunk written). Debian's libhdf5 1.10 reads a
  // chunk whose coordinate was corrupted into another place instead of
  // refusing it as newer versions do ("bad coordinate offset"), which would
  // give wrong values with exit 0 (found by tools/mutate.py).
  void check_chunk_index(hid_t ds, const std::vector<hsize_t>& dims, const std::string& what) const {
    Handle dcpl = checked_handle(H5Dget_create_plist(ds), ErrorCode::kDataLoss, what);
    if (H5Pget_layout(dcpl) != H5D_CHUNKED) return;
    std::vector<hsize_t> chunk(dims.size());
    if (H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()) != static_cast<int>(chunk.size()))
      fail_data_loss(what + ": its chunk shape does not match its rank");
    uint64_t expected = 1;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (chunk[d] == 0) fail_data_loss(what + ": a chunk dimension of 0");
      if (dims[d] == 0) return;  // empty: no chunks
      expected = checked_mul(expected, (dims[d] + chunk[d] - 1) / chunk[d], "chunk count");
    }
    hsize_t n = 0;
    Handle space = checked_handle(H5Dget_space(ds), ErrorCode::kDataLoss, what);  // 1.10 takes no H5S_ALL here
    check(H5Dget_num_chunks(ds, space, &n), ErrorCode::kDataLoss, what);
    if (n != expected)
      fail_data_loss(what + ": its chunk index holds " + std::to_string(n) + " chunks where its extent needs " +
                     std::to_string(expected));
    std::set<std::vector<hsize_t>> seen;
    std::vector<hsize_t> offset(dims.size());
    for (hsize_t i = 0; i < n; ++i) {
      unsigned filter_mask = 0;
      haddr_t addr = 0;
      hsize_t size = 0;
      check(H5Dget_chunk_info(ds, space, i, offset.data(), &filter_mask, &addr, &size), ErrorCode::kDataLoss, what);
      for (std::size_t d = 0; d < dims.size(); ++d)
        if (offset[d] >= dims[d] || offset[d] % chunk[d] != 0)
          fail_data_loss(what + ": chunk " + std::to_string(i) +
                         " has a coordinate off the chunk grid or outside "
                         "the dataset (a corrupt chunk index)");
      if (addr == HADDR_UNDEF || addr > file_size_ || size > file_size_ - addr)
        fail_data_loss(what + ": chunk " + std::to_string(i) + " lies outside the file");
      if (!seen.insert(offset).second) fail_data_loss(what + ": two chunks at one coordinate (a corrupt chunk index)");
    }
  }

  void read_dataset(hid_t group, const std::string& name, const std::string& path, haddr_t address) {
    std::string what = "dataset '" + path + "'";
    Handle ds = checked_handle(H5Dopen2(group, name.c_str(), H5P_DEFAULT), ErrorCode::kDataLoss, what);
    auto dtype_attr = read_string_attribute(ds, "dtype");
    if (!dtype_attr) fail_data_loss(what + " has no dtype attribute");
    auto dtype = dtype_from_name(*dtype_attr);
    if (!dtype) fail_data_loss(what + ": unknown dtype '" + *dtype_attr + "'");
    Handle type = checked_handle(H5Dget_type(ds), ErrorCode::kDataLoss, what);
    if (H5Tget_size(type) != dtype_size(*dtype))
      fail_data_loss(what + ": HDF5 type of " + std::to_string(H5Tget_size(type)) + " bytes for " + *dtype_attr);
    // Bytes are read as stored: a big-endian type would come out swapped.
    H5T_class_t cls = H5Tget_class(type);
    if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && H5Tget_size(type) > 1 && H5Tget_order(type) == H5T_ORDER_BE)
      fail(ErrorCode::kUnimplemented, what + ": big-endian " + *dtype_attr +
                                          " data is not supported (ckptconv reads little-endian datasets, as it "
                                          "writes them); convert it with h5py first");
    Handle space = checked_handle(H5Dget_space(ds), ErrorCode::kDataLoss, what);
    int rank = check(H5Sget_simple_extent_ndims(space), ErrorCode::kDataLoss, what);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), maxdims(static_cast<std::size_t>(rank));
    check(H5Sget_simple_extent_dims(space, dims.data(), maxdims.data()), ErrorCode::kDataLoss, what);
    // Newer libhdf5 (and so h5py) refuses a dataspace larger than its own
    // maximum; Debian's 1.10 reads it, past the data that was written (a
    // flipped bit in a dimension, found by tools/mutate.py).
    for (std::size_t d = 0; d < dims.size(); ++d)
      if (maxdims[d] != H5S_UNLIMITED && dims[d] > maxdims[d])
        fail_data_loss(what + ": dimension " + std::to_string(d) + " of " + std::to_string(dims[d]) +
                       " exceeds its maximum " + std::to_string(maxdims[d]) + " (a corrupt dataspace)");
    TensorEntry t;
    t.name = path;
    t.dtype = *dtype;
    for (hsize_t d : dims) t.shape.push_back(static_cast<int64_t>(d));
    // A shape past torch's limits, named with its dataset (the size below
    // would be a bare overflow).
    if (std::string p = tensor_shape_problem(t); !p.empty())
      fail_data_loss(what + ": shape " + shape_str(t.shape) + " " + p);
    check_declared_size(ds, what, checked_mul(shape_numel(t.shape), dtype_size(*dtype), "dataset size"));
    check_chunk_index(ds, dims, what);  // after the size check, which bounds the chunk count
    TensorChunk c;
    c.offsets.assign(t.shape.size(), 0);
    c.sizes = t.shape;
    c.strides = contiguous_strides(t.shape);
    c.file = path_;
    c.storage = std::make_shared<DatasetSource>(file_, address, t.shape, dtype_size(*dtype), path_ + ": " + what);
    t.chunks.push_back(std::move(c));
    model_.tensors.push_back(std::move(t));
  }

  std::string path_;
  std::shared_ptr<const Handle> file_;
  CheckpointModel& model_;
  uint64_t file_size_;
  std::map<haddr_t, std::size_t> by_address_;
  std::map<haddr_t, ValuePtr> groups_;  // nullptr while the group is being read
};

// The whole read, in this process: only the child calls it.
CheckpointModel read_with_libhdf5(const std::string& path) {
  return with_context(path, [&] {
    silence_hdf5_errors();
    auto file = std::make_shared<const Handle>(checked_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                                                              ErrorCode::kDataLoss, "cannot open as HDF5"));
    Handle root = checked_handle(H5Gopen2(*file, "/", H5P_DEFAULT), ErrorCode::kDataLoss, "root group");
    auto version = read_int_attribute(root, "ckptconv.layout_version");
    if (!version)
      fail(ErrorCode::kUnimplemented,
           "an HDF5 file not written by ckptconv (no ckptconv.layout_version attribute on /); see docs/hdf5-layout.md");
    if (*version != kLayoutVersion)
      fail(ErrorCode::kUnimplemented, "HDF5 layout version " + std::to_string(*version) + " (this ckptconv reads " +
                                          std::to_string(kLayoutVersion) + ")");
    CheckpointModel model;
    model.source = path;
    if (auto src = read_string_attribute(root, "ckptconv.source_format")) model.facts["source_format"] = *src;
    EntryStat st = stat_path(path);
    if (!st.is_file()) fail_data_loss("cannot stat: not a regular file");
    uint64_t file_size = st.size;
    Hdf5Reader reader(path, file, model, file_size);
    model.root = reader.read_group(root, "", 0);
    return model;
  });
}

std::string read_request(uint64_t index, uint64_t pos, uint64_t n);

// The tensor bytes of dataset `index`, read by the child (read_hdf5_file).
class IsolatedDatasetSource final : public ByteSource {
 public:
  IsolatedDatasetSource(std::shared_ptr<IsolatedServer> reader, std::size_t index, uint64_t size,
                        const std::string& path, const std::string& dataset)
      : reader_(std::move(reader)),
        index_(index),
        size_(size),
        dataset_("dataset '" + dataset + "'"),
        describe_(path + ": " + dataset_) {}

  uint64_t size() const override { return size_; }
  std::string describe() const override { return describe_; }

  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    if (n == 0) return;
    reader_->call_into(read_request(index_, pos, n), dataset_, buf, n);
  }

 private:
  std::shared_ptr<IsolatedServer> reader_;
  std::size_t index_;
  uint64_t size_;
  std::string dataset_;   // "dataset 'model.w'": the request, in messages
  std::string describe_;  // "m.h5: dataset 'model.w'"
};

// The requests the child serves: kStructure, then reads of dataset bytes
// ('R', then the dataset's index, the position and the length, 8 bytes each).
constexpr char kStructure[] = "structure";

std::string read_request(uint64_t index, uint64_t pos, uint64_t n) {
  std::string r(1, 'R');
  for (uint64_t v : {index, pos, n}) r.append(reinterpret_cast<const char*>(&v), sizeof v);
  return r;
}

// The file as the structure was read: its size and modification time.
struct FileState {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

FileState file_state(const std::string& path) {
  EntryStat st = stat_path(path);
  if (!st.is_file()) fail_data_loss(path + ": cannot stat: not a regular file");
  return {st.size, st.mtime_ns};
}

// The child's side: the model libhdf5 read, kept between requests.
struct ChildState {
  std::optional<CheckpointModel> model;
  FileState opened;
};

void serve_request(const std::string& path, ChildState& state, const std::string& request, std::string& reply) {
  auto& model = state.model;
  if (request == kStructure) {
    state.opened = file_state(path);
    model = read_with_libhdf5(path);
    // A shared subtree is one node of the message; read_checkpoint bounds
    // the tree it expands to, in the tool.
    reply = with_context(path, [&] { return structure_message(*model); });
    return;
  }
  uint64_t v[3];
  if (!model || request.size() != 1 + sizeof v || request[0] != 'R')
    fail(ErrorCode::kInternal, "the HDF5 reader process got an unknown request");
  std::memcpy(v, request.data() + 1, sizeof v);
  if (v[0] >= model->tensors.size()) fail(ErrorCode::kInternal, "the HDF5 reader process got a read of no dataset");
  reply.resize(static_cast<std::size_t>(v[2]));
  model->tensors[v[0]].chunks.front().storage->read(v[1], reply.data(), reply.size());
  // libhdf5 reads past the end of a file as zeros: a file truncated (or
  // rewritten) while the job ran gave exit 0 and zeros. Checked after the
  // read, so that a change before or during it is seen.
  FileState now = file_state(path);
  if (now.size != state.opened.size || now.mtime_ns != state.opened.mtime_ns)
    fail_data_loss(path + " changed while it was read (" + std::to_string(state.opened.size) + " bytes, now " +
                   std::to_string(now.size) + "); nothing was written");
}

}  // namespace

CheckpointModel read_hdf5_file(const std::string& path, double timeout_s) {
  // libhdf5 trusts the structures it reads: single bit flips in a file
  // ckptconv wrote made it crash (SIGSEGV in H5HG_read), loop, or overflow a
  // heap buffer without crashing (H5O__msg_iterate_real). So libhdf5 reads
  // the file only in a child process, for as long as the model lives: its
  // structure, then each slab of tensor bytes the work asks for. A crash or
  // a hang there is a refusal (exit 3); this process builds the model from
  // the child's message (hdf5_structure.h) and copies the bytes it sends.
  // libhdf5 opens files by name: a backend without local files (s3://) cannot serve it.
  if (!storage_for(path).local_path(path))
    fail(ErrorCode::kUnimplemented,
         path + ": HDF5 files are read by libhdf5, which needs a local file; copy it to local storage first");
  const uint64_t file_bytes = stat_path(path).size;  // 0 when missing: the open names it
  IsolationLimits limits{timeout_s, hdf5_memory_budget(file_bytes), "hdf5-memory"};
  auto reader = std::make_shared<IsolatedServer>(
      "reading " + path + " with libhdf5", limits,
      [path, state = ChildState()](const std::string& request, std::string& reply) mutable {
        serve_request(path, state, request, reply);
      });
  // The message is about 100 bytes a tensor, and each node of the tree
  // stands for bytes of the file (a link, an attribute's JSON): a child that
  // sends more than this is not telling the file's structure.
  uint64_t max_message = (uint64_t{64} << 20) + 16 * file_bytes;
  std::string message = reader->call(kStructure, "its structure", max_message);
  return with_context(path, [&] {
    return model_from_structure(message, path, [&](std::size_t index, uint64_t nbytes, const std::string& name) {
      return std::make_shared<IsolatedDatasetSource>(reader, index, nbytes, path, name);
    });
  });
}

}  // namespace ckpt::hdf5
