#include "formats/dcp/dcp_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "pickle/pickler.h"

namespace ckpt::dcp {
namespace {

namespace fs = std::filesystem;
using pickle::Value;
using pickle::ValuePtr;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

// Builds the Metadata value tree; globals are shared so the pickler writes
// each class path once, as torch's pickles do.
class MetadataBuilder {
 public:
  ValuePtr build(const DcpMetadata& md, const std::optional<std::string>& checkpoint_id, const std::string& save_id) {
    std::vector<std::pair<ValuePtr, ValuePtr>> sdm, planner, storage;
    for (const ItemMeta& item : md.items) sdm.emplace_back(Value::str(item.fqn), item_metadata(item));
    for (const std::string& key : md.planner_order) {
      auto it = md.planner_data.find(key);
      planner.emplace_back(Value::str(key), Value::tuple(it->second));
    }
    for (const ItemMeta& item : md.items) {
      if (!item.is_tensor) {
        storage.emplace_back(index(item.fqn, std::nullopt, std::nullopt), storage_info(lookup(md, item.fqn, {})));
        continue;
      }
      for (std::size_t c = 0; c < item.chunks.size(); ++c) {
        const Shape& offsets = item.chunks[c].offsets;
        storage.emplace_back(index(item.fqn, offsets, static_cast<int64_t>(c)),
                             storage_info(lookup(md, item.fqn, offsets)));
      }
    }
    ValuePtr meta = object(kMetadataModule, "StorageMeta",
                           {{"checkpoint_id", checkpoint_id ? Value::str(*checkpoint_id) : Value::none()},
                            {"save_id", Value::str(save_id)},
                            {"load_id", Value::none()},
                            {"modules", Value::list({})}});
    return object(kMetadataModule, "Metadata",
                  {{"state_dict_metadata", Value::dict(std::move(sdm))},
                   {"planner_data", Value::dict(std::move(planner))},
                   {"storage_data", Value::dict(std::move(storage))},
                   {"storage_meta", meta},
                   {"version", Value::str("1.0.0")}});
  }

 private:
  ValuePtr global(const std::string& module, const std::string& name) {
    auto& slot = globals_[module + "." + name];
    if (!slot) slot = Value::global(module, name);
    return slot;
  }

  // cls.__new__(cls) then BUILD with `state`, as pickle writes dataclasses.
  ValuePtr object_with_state(const std::string& module, const std::string& cls, ValuePtr state) {
    ValuePtr obj = Value::call(global(module, cls), Value::tuple({}));
    obj->newobj = true;
    return Value::built(obj, std::move(state));
  }

  ValuePtr object(const std::string& module, const std::string& cls,
                  std::vector<std::pair<std::string, ValuePtr>> fields) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (auto& [k, v] : fields) entries.emplace_back(Value::str(k), std::move(v));
    return object_with_state(module, cls, Value::dict(std::move(entries)));
  }

  ValuePtr size(const Shape& s) {
    std::vector<ValuePtr> items;
    for (int64_t d : s) items.push_back(Value::integer(d));
    return Value::call(global("torch", "Size"), Value::tuple({Value::tuple(std::move(items))}));
  }

  ValuePtr int_tuple(const Shape& s) {
    std::vector<ValuePtr> items;
    for (int64_t d : s) items.push_back(Value::integer(d));
    return Value::tuple(std::move(items));
  }

  ValuePtr properties(DType dtype, const Shape& shape) {
    ValuePtr layout =
        Value::call(global("torch.serialization", "_get_layout"), Value::tuple({Value::str("torch.strided")}));
    ValuePtr mem_format =
        Value::call(global(kMetadataModule, "_MEM_FORMAT_ENCODING"), Value::tuple({Value::integer(0)}));
    ValuePtr state = Value::tuple({global("torch", std::string(dtype_name(dtype))), layout, Value::boolean(false),
                                   mem_format, Value::boolean(false), int_tuple(contiguous_strides(shape))});
    return object_with_state(kMetadataModule, "TensorProperties", state);
  }

  ValuePtr item_metadata(const ItemMeta& item) {
    if (!item.is_tensor) {  // an empty dataclass: NEWOBJ, no BUILD
      ValuePtr bytes = Value::call(global(kMetadataModule, "BytesStorageMetadata"), Value::tuple({}));
      bytes->newobj = true;
      return bytes;
    }
    std::vector<ValuePtr> chunks;
    for (const ChunkMeta& c : item.chunks)
      chunks.push_back(
          object(kMetadataModule, "ChunkStorageMetadata", {{"offsets", size(c.offsets)}, {"sizes", size(c.sizes)}}));
    return object(kMetadataModule, "TensorStorageMetadata",
                  {{"properties", properties(item.dtype, item.size)},
                   {"size", size(item.size)},
                   {"chunks", Value::list(std::move(chunks))}});
  }

  ValuePtr index(const std::string& fqn, const std::optional<Shape>& offsets, std::optional<int64_t> hint) {
    std::vector<std::pair<std::string, ValuePtr>> fields = {{"fqn", Value::str(fqn)},
                                                            {"index", hint ? Value::integer(*hint) : Value::none()}};
    if (offsets) fields.emplace_back("offset", size(*offsets));
    return object(kMetadataModule, "MetadataIndex", std::move(fields));
  }

  static const StorageInfo& lookup(const DcpMetadata& md, const std::string& fqn, const Shape& offsets) {
    auto it = md.storage.find({fqn, offsets});
    if (it == md.storage.end())
      fail(ErrorCode::kInternal, "no storage entry for '" + fqn + "' at " + shape_str(offsets));
    return it->second;
  }

  ValuePtr storage_info(const StorageInfo& info) {
    return object("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                  {{"relative_path", Value::str(info.relative_path)},
                   {"offset", Value::integer(static_cast<int64_t>(info.offset))},
                   {"length", Value::integer(static_cast<int64_t>(info.length))}});
  }

  std::unordered_map<std::string, ValuePtr> globals_;
};

std::string uuid4() {
  // random_device draws from the kernel's generator (getrandom), as
  // Python's uuid.uuid4 does through os.urandom.
  std::random_device rd;
  unsigned char b[16] = {};
  for (auto& byte : b) byte = static_cast<unsigned char>(rd());
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

}  // namespace

std::string encode_metadata(const DcpMetadata& md, const std::optional<std::string>& checkpoint_id,
                            const std::string& save_id) {
  MetadataBuilder builder;
  return pickle::pickle_protocol2(*builder.build(md, checkpoint_id, save_id));
}

std::string random_save_id() { return uuid4(); }

StorageInfo append_item_to(ByteSink& sink, int rank, const pickle::Value& root,
                           const std::vector<torch_pt::OutputTensor>& tensors, const torch_pt::FillTensor& fill) {
  StorageInfo info;
  info.relative_path = rank_file_name(rank);
  info.offset = sink.position();
  torch_pt::write_pt(sink, root, tensors, fill);
  info.length = sink.position() - info.offset;
  return info;
}

}  // namespace ckpt::dcp
