#include "formats/torch_pt/pt_reader.h"

#include <optional>
#include <string>
#include <unordered_map>

#include "archive/zip_reader.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/problems.h"
#include "formats/pyobj.h"
#include "formats/torch_pt/sharded_values.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

namespace ckpt::torch_pt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Decodes one archive's data.pkl, replacing tensors by references.
class ArchiveDecoder {
 public:
  ArchiveDecoder(archive::ZipReader& zip, std::vector<TensorEntry>& tensors, int rank)
      : zip_(zip), tensors_(tensors), rank_(rank) {}

  // The archive's storages hold big-endian elements (its byteorder record).
  void set_big_endian(bool big) { big_endian_ = big; }

  ValuePtr transform(const ValuePtr& v, const std::string& path) {
    if (!v) return v;
    if (auto it = done_.find(v.get()); it != done_.end()) return it->second;
    ValuePtr out = transform_uncached(v, path);
    done_[v.get()] = out;
    return out;
  }

  // The zip record each decoded tensor's storage is (keyed by the storage
  // source, which chunks keep through renumbering and moves).
  const std::unordered_map<const ByteSource*, std::string>& storage_records() const { return storage_records_; }

 private:
  ValuePtr transform_uncached(const ValuePtr& v, const std::string& path);
  ValuePtr decode_tensor(const Value& call, const std::string& path, bool v3);
  ValuePtr decode_from_type(const ValuePtr& call, const std::string& path);
  ValuePtr copy_container(const ValuePtr& v, const std::string& path);

  archive::ZipReader& zip_;
  std::vector<TensorEntry>& tensors_;
  int rank_;
  bool big_endian_ = false;
  std::unordered_map<const Value*, ValuePtr> done_;
  std::unordered_map<const ByteSource*, std::string> storage_records_;
};

std::string child_path(const std::string& path, const Value& key) {
  std::string k = key.is(Kind::kStr) ? key.text : key.is(Kind::kInt) ? std::to_string(key.int_value) : key.repr(1);
  return path.empty() ? k : path + "." + k;
}

ValuePtr ArchiveDecoder::copy_container(const ValuePtr& v, const std::string& path) {
  auto out = std::make_shared<Value>(*v);
  done_[v.get()] = out;  // a container reached again through the memo stays one object
  for (std::size_t i = 0; i < out->items.size(); ++i)
    out->items[i] = transform(v->items[i], path.empty() ? std::to_string(i) : path + "." + std::to_string(i));
  for (auto& [key, value] : out->entries) value = transform(value, child_path(path, *key));
  if (out->args) out->args = transform(v->args, path);
  if (out->state) out->state = transform(v->state, path);
  if (out->object) out->object = transform(v->object, path);
  return out;
}

// DeepSpeed's records in ZeRO optimizer files, as plain data: the enum
// ZeroStageEnum(n) (or getattr(ZeroStageEnum, 'NAME')) as n, a LossScaler / DynamicLossScaler / fragment_address
// (NEWOBJ then BUILD with a dict) as that dict. The policy admitted exactly
// these shapes; readers (formats/zero) and outputs see only plain values.
ValuePtr deepspeed_record_as_data(const Value& v) {
  if (v.is(Kind::kCall) && v.callable && v.args && v.args->is(Kind::kTuple)) {
    const bool stage = v.callable->is_global("deepspeed.runtime.zero.config", "ZeroStageEnum") ||
                       (v.callable->is_global("builtins", "getattr") && !v.args->items.empty() &&
                        v.args->items[0]->is_global("deepspeed.runtime.zero.config", "ZeroStageEnum"));
    if (auto n = stage ? pickle::enum_value(v) : std::nullopt) return Value::integer(*n);
  }
  if (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kCall) && v.object->callable &&
      v.object->callable->is(Kind::kGlobal) && v.state && v.state->is(Kind::kDict)) {
    const Value& cls = *v.object->callable;
    if (cls.is_global("deepspeed.runtime.fp16.loss_scaler", "LossScaler") ||
        cls.is_global("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler") ||
        cls.is_global("deepspeed.utils.tensor_fragment", "fragment_address"))
      return v.state;
  }
  return nullptr;
}

ValuePtr ArchiveDecoder::transform_uncached(const ValuePtr& v, const std::string& path) {
  if (ValuePtr data = deepspeed_record_as_data(*v)) return transform(data, path);
  if (v->is(Kind::kCall) && v->callable && v->callable->is(Kind::kGlobal)) {
    const Value& fn = *v->callable;
    if (fn.is_global("torch._utils", "_rebuild_tensor_v2")) return decode_tensor(*v, path, false);
    if (fn.is_global("torch._utils", "_rebuild_tensor_v3")) return decode_tensor(*v, path, true);
    if (fn.is_global("torch._tensor", "_rebuild_from_type_v2")) return decode_from_type(v, path);
    if (fn.is_global("torch._utils", "_rebuild_parameter") ||
        fn.is_global("torch._utils", "_rebuild_parameter_with_state")) {
      const auto& args = v->args->as_sequence();
      if (args.size() < 2) fail_data_loss("_rebuild_parameter has too few arguments at '" + path + "'");
      ValuePtr inner = transform(args[0], path);
      if (auto idx = tensor_ref_index(*inner)) {
        tensors_[*idx].storage = StorageKind::kParameter;
        tensors_[*idx].requires_grad = args[1]->is(Kind::kBool) && args[1]->bool_value;
      }
      return inner;
    }
  }
  switch (v->kind) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kCall:
    case Kind::kBuilt: return copy_container(v, path);
    default: return v;
  }
}

// _rebuild_from_type_v2(func, type, args, state): a tensor whose Python
// object carried attributes (FSDP sets `_has_been_cloned`) or a tensor
// subclass. For torch.Tensor / Parameter the attributes are dropped: the
// tensor is func(*args). Subclasses (ShardedTensor, DTensor) are decoded by
// decode_sharded_value.
ValuePtr ArchiveDecoder::decode_from_type(const ValuePtr& call, const std::string& path) {
  const auto& a = call->args->as_sequence();
  if (a.size() < 3) fail_data_loss("_rebuild_from_type_v2 has too few arguments at '" + path + "'");
  const Value& type = *a[1];
  if (type.is_global("torch", "Tensor") || type.is_global("torch.nn.parameter", "Parameter")) {
    // A fresh call object: decoded directly, never through the pointer-keyed cache.
    ValuePtr inner = transform_uncached(Value::call(a[0], a[2]), path);
    if (auto idx = tensor_ref_index(*inner); idx && type.name == "Parameter")
      tensors_[*idx].storage = StorageKind::kParameter;
    return inner;
  }
  ValuePtr decoded = copy_container(call, path);
  if (auto t = decode_sharded_value(*decoded, type, path, tensors_)) {
    tensors_.push_back(std::move(*t));
    return make_tensor_ref(tensors_.size() - 1);
  }
  return decoded;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
// _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
// storage = BINPERSID(('storage', <class>, key, location, numel))
ValuePtr ArchiveDecoder::decode_tensor(const Value& call, const std::string& path, bool v3) {
  return with_context("tensor '" + path + "'", [&]() -> ValuePtr {
    const auto& args = call.args->as_sequence();
    if (args.size() < (v3 ? 7u : 5u))
      fail_data_loss("tensor rebuild call has " + std::to_string(args.size()) + " arguments");
    if (!args[0]->is(Kind::kPersId) || !args[0]->pid) fail_data_loss("tensor storage is not a persistent id");
    const auto& pid = args[0]->pid->as_sequence();
    if (pid.size() < 5 || pid[0]->as_str() != "storage")
      fail_data_loss("storage id is not ('storage', class, key, location, numel)");
    const Value& cls = *pid[1];
    if (!cls.is(Kind::kGlobal)) fail_data_loss("storage class is not a global");
    std::optional<DType> dtype;
    if (v3) {
      dtype = pyobj::torch_dtype(*args[6]);
    } else {
      dtype = dtype_from_storage_class(cls.name);
    }
    if (!dtype)
      fail(ErrorCode::kUnimplemented, "unsupported tensor element type (storage " + cls.text + "." + cls.name + ")");
    const std::string& key = pid[2]->as_str();
    const archive::ZipEntry& record = zip_.record("data/" + key);
    // torch.load refuses a storage whose record is not the size its id
    // names (numel elements of the class's dtype, bytes for an
    // UntypedStorage): a damaged or spliced file, not one to read.
    const std::optional<DType> class_dtype = dtype_from_storage_class(cls.name);
    const int64_t numel = pid[4]->as_int();
    const uint64_t itemsize = dtype_size(class_dtype                    ? *class_dtype
                                         : cls.name == "UntypedStorage" ? DType::kUInt8
                                                                        : *dtype);
    if (numel < 0 || checked_mul(static_cast<uint64_t>(numel), itemsize, "storage size") != record.size)
      fail_data_loss("storage '" + key + "' names " + std::to_string(numel) + " elements of " +
                     std::to_string(itemsize) + " bytes, its record " + record.name + " holds " +
                     std::to_string(record.size) + " bytes");

    TensorEntry t;
    t.name = path;
    t.dtype = *dtype;
    t.shape = pyobj::int_sequence(*args[2], "tensor size");
    t.requires_grad = args[4]->is(Kind::kBool) && args[4]->bool_value;
    TensorChunk c;
    c.offsets.assign(t.shape.size(), 0);
    c.sizes = t.shape;
    c.strides = pyobj::int_sequence(*args[3], "tensor stride");
    c.storage_offset = args[1]->as_int();
    c.storage = zip_.open(record);
    storage_records_[c.storage.get()] = record.name;
    c.storage_crc = record.crc32;
    c.record = record.name;
    // torch.load swaps a storage by the dtype its class names; an
    // UntypedStorage (float8, uint16/32/64) counts as uint8 there, so its
    // bytes are read as stored, and so are they here.
    c.big_endian = big_endian_ && cls.name != "UntypedStorage";
    c.file = zip_.source()->describe();
    c.rank = rank_;
    if (c.strides.size() != c.sizes.size()) fail_data_loss("tensor stride and size differ in length");
    t.chunks.push_back(std::move(c));
    tensors_.push_back(std::move(t));
    return make_tensor_ref(tensors_.size() - 1);
  });
}

// Verifies the CRC-32 of every record of the archive, reporting each
// mismatch with the tensors stored in that record; with
// `skip_tensor_records`, only the records that hold none of `tensors`
// (validate checks those in its data pass: ProblemSink::tensor_records_checked_later).
void verify_records(const archive::ZipReader& zip, const std::vector<TensorEntry>& tensors,
                    const std::unordered_map<const ByteSource*, std::string>& storage_records, int rank,
                    ProblemSink& sink, bool skip_tensor_records = false) {
  std::unordered_map<std::string, std::vector<std::string>> holders;  // record name -> tensor names
  for (const auto& t : tensors)
    for (const auto& c : t.chunks)
      if (auto it = storage_records.find(c.storage.get()); it != storage_records.end())
        holders[it->second].push_back(t.name);
  for (const auto& entry : zip.entries()) {
    if (skip_tensor_records && holders.count(entry.name)) continue;
    try {
      zip.verify_crc(entry);
    } catch (const Error& e) {
      Problem p{e.code(), e.what(), zip.source()->describe(), rank, ""};
      if (auto it = holders.find(entry.name); it != holders.end()) {
        p.tensor = it->second.front();
        p.message += "; the record holds tensor '" + p.tensor + "'";
        for (std::size_t i = 1; i < it->second.size(); ++i) p.message += " and '" + it->second[i] + "'";
      }
      if (rank >= 0) p.message += " (rank " + std::to_string(rank) + ")";
      sink.report(std::move(p));
    }
  }
}

}  // namespace

bool is_torch_zip(const ByteSource& source) { return archive::looks_like_zip(source); }

bool is_legacy_torch_save(const ByteSource& source) {
  if (source.size() >= 262 && source.read_string(257, 5) == "ustar") return true;
  // Legacy non-tar files start with a protocol-2 pickle of torch's magic number (LONG1 of 10 bytes).
  return source.size() >= 4 && source.read_string(0, 4) == std::string("\x80\x02\x8a\x0a", 4);
}

// The records that say how to read the rest, checked as torch checks them:
// a value it would refuse is refused here instead of read as if it were the
// usual one. True when the byteorder is big.
bool check_format_records(const archive::ZipReader& zip) {
  auto text = [&](const char* name) -> std::optional<std::string> {
    const archive::ZipEntry* e = zip.find_record(name);
    if (!e) return std::nullopt;
    if (e->size > 64) fail_data_loss(std::string("record '") + name + "' is " + std::to_string(e->size) + " bytes");
    std::string v = zip.open(*e)->read_string(0, static_cast<std::size_t>(e->size));
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' ')) v.pop_back();
    return v;
  };
  // torch.save records the writer's byte order and torch.load byte-swaps
  // each storage's elements when it differs from its own: a file saved on a
  // big-endian machine (s390x) reads the same everywhere. So do we: its
  // chunks are marked, and every copy of their bytes swaps each element
  // (exec/tensor_copy), whatever the output.
  bool big = false;
  if (auto order = text("byteorder"); order && *order != "little") {
    if (*order != "big") fail(ErrorCode::kUnimplemented, "byteorder '" + *order + "' is neither 'little' nor 'big'");
    big = true;
  }
  if (auto fv = text(".format_version"); fv && *fv != "1")
    fail(ErrorCode::kUnimplemented, ".format_version '" + *fv + "' is not one torch.save writes (1)");
  // caffe2/serialize: kMinSupportedFileFormatVersion 1 .. kMaxSupportedFileFormatVersion 10.
  if (auto v = text("version")) {
    bool digits = !v->empty() && v->size() <= 4 && v->find_first_not_of("0123456789") == std::string::npos;
    int n = digits ? std::stoi(*v) : -1;
    if (n < 1 || n > 10)
      fail(ErrorCode::kUnimplemented, "archive version '" + *v + "' is outside the versions torch reads (1 to 10)");
  }
  return big;
}

pickle::ValuePtr decode_archive(const SourcePtr& source, std::vector<TensorEntry>& tensors,
                                const std::string& name_prefix, int rank, ProblemSink* verify,
                                const pickle::GlobalPolicy& policy) {
  archive::ZipReader zip(source);
  std::vector<TensorEntry> found;
  ArchiveDecoder decoder(zip, found, rank);
  std::string prefix = name_prefix;
  if (!prefix.empty() && prefix.back() == '.') prefix.pop_back();
  ValuePtr root;
  try {
    decoder.set_big_endian(with_context(source->describe(), [&] { return check_format_records(zip); }));
    const archive::ZipEntry& pkl = zip.record("data.pkl");
    // The structure every tensor is read through: a corrupt one must not be
    // decoded into a plausible wrong tree (validate reports it below, with
    // the other records).
    if (!verify) with_context(source->describe(), [&] { zip.verify_crc(pkl); });
    ValuePtr raw = with_context(source->describe(), [&] {
      return with_context("data.pkl", [&] { return pickle::unpickle(*zip.open(pkl), policy); });
    });
    root = with_context(source->describe(), [&] { return decoder.transform(raw, prefix); });
  } catch (const Error&) {
    // A record that fails its CRC (data.pkl itself, often) explains the
    // decoding error: report those first.
    if (verify) verify_records(zip, found, decoder.storage_records(), rank, *verify);
    throw;
  }
  // References are renumbered to follow the caller's tensors.
  prune_unreferenced(root, found, tensors.size());
  if (verify)
    verify_records(zip, found, decoder.storage_records(), rank, *verify, verify->tensor_records_checked_later);
  for (auto& t : found) tensors.push_back(std::move(t));
  // The headers and pickle were read through the mapping; the page cache
  // may hold the file in large folios, each mapped whole by one touch (2 MiB
  // of RSS per archive header read). Unmap them: tensor bytes are read
  // later, slice by slice, and re-fault what they need.
  source->release(0, source->size());
  return root;
}

CheckpointModel read_pt_file(const std::string& path, ProblemSink* verify) {
  SourcePtr source = open_mapped_source(path);
  if (!is_torch_zip(*source)) {
    if (is_legacy_torch_save(*source))
      fail(ErrorCode::kUnimplemented, path +
                                          ": legacy torch.save format (torch < 1.6) is not supported; "
                                          "load and re-save it with a current torch");
    fail_data_loss(path + ": not a torch.save zip archive");
  }
  CheckpointModel model;
  model.source = path;
  model.root = decode_archive(source, model.tensors, "", -1, verify);
  return model;
}

}  // namespace ckpt::torch_pt
