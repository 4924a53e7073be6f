#include "formats/torch_pt/pt_writer.h"

#include <unordered_map>

#include "core/error.h"
#include "pickle/pickler.h"

namespace ckpt::torch_pt {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr int_tuple(const Shape& s) {
  std::vector<ValuePtr> items;
  for (int64_t d : s) items.push_back(Value::integer(d));
  return Value::tuple(std::move(items));
}

// Builds the pickle tree torch.save would write for the model's structure.
class RebuildBuilder {
 public:
  explicit RebuildBuilder(const std::vector<OutputTensor>& tensors) : tensors_(tensors) {}

  ValuePtr build(const Value& v) {
    if (auto it = done_.find(&v); it != done_.end()) return it->second;
    ValuePtr out;
    if (auto idx = tensor_ref_index(v)) {
      out = rebuild_call(*idx);
    } else {
      out = std::make_shared<Value>(v);
      for (auto& item : out->items) item = build(*item);
      for (auto& [key, value] : out->entries) {
        key = build(*key);
        value = build(*value);
      }
      if (out->args) out->args = build(*out->args);
      if (out->object) out->object = build(*out->object);
      if (out->state) out->state = build(*out->state);
      if (out->pid) out->pid = build(*out->pid);
    }
    done_[&v] = out;
    return out;
  }

  // Tensor indices in storage-key order (order of first appearance).
  const std::vector<std::size_t>& storage_order() const { return order_; }

 private:
  ValuePtr rebuild_call(std::size_t index) {
    if (index >= tensors_.size()) fail(ErrorCode::kInternal, "tensor reference out of range");
    const OutputTensor& t = tensors_[index];
    const DTypeInfo& info = dtype_info(t.dtype);
    std::string key = std::to_string(order_.size());
    order_.push_back(index);
    bool v3 = info.storage_class.empty();
    int64_t numel = static_cast<int64_t>(shape_numel(t.shape));
    ValuePtr pid = Value::tuple({str_storage_, v3 ? untyped_storage_ : global("torch", std::string(info.storage_class)),
                                 Value::str(key), cpu_, Value::integer(v3 ? numel * int64_t(info.itemsize) : numel)});
    std::vector<ValuePtr> args = {Value::persistent_id(pid), Value::integer(0),
                                  int_tuple(t.shape),        int_tuple(contiguous_strides(t.shape)),
                                  Value::boolean(false),     empty_hooks()};
    if (v3) args.push_back(global("torch", std::string(info.name)));
    ValuePtr tensor = Value::call(v3 ? rebuild_v3_ : rebuild_v2_, Value::tuple(std::move(args)));
    if (!t.parameter) return tensor;
    return Value::call(global("torch._utils", "_rebuild_parameter"),
                       Value::tuple({tensor, Value::boolean(t.requires_grad), empty_hooks()}));
  }

  ValuePtr empty_hooks() { return Value::call(ordered_dict_, Value::tuple({})); }

  // Globals are shared so the pickler memoizes them, as torch's pickles do.
  ValuePtr global(const std::string& module, const std::string& name) {
    auto& slot = globals_[module + "." + name];
    if (!slot) slot = Value::global(module, name);
    return slot;
  }

  const std::vector<OutputTensor>& tensors_;
  std::unordered_map<const Value*, ValuePtr> done_;
  std::unordered_map<std::string, ValuePtr> globals_;
  std::vector<std::size_t> order_;
  ValuePtr rebuild_v2_ = global("torch._utils", "_rebuild_tensor_v2");
  ValuePtr rebuild_v3_ = global("torch._utils", "_rebuild_tensor_v3");
  ValuePtr untyped_storage_ = global("torch.storage", "UntypedStorage");
  ValuePtr ordered_dict_ = global("collections", "OrderedDict");
  ValuePtr str_storage_ = Value::str("storage");
  ValuePtr cpu_ = Value::str("cpu");
};

// torch writes 40 decimal digits; any value works for loading. Derived from
// the pickle so that equal inputs give byte-identical outputs.
std::string serialization_id(const std::string& pickle_bytes) {
  uint64_t h1 = 1469598103934665603ull, h2 = 1099511628211ull;
  for (unsigned char ch : pickle_bytes) {
    h1 = (h1 ^ ch) * 1099511628211ull;
    h2 = (h2 + ch) * 6364136223846793005ull + 1442695040888963407ull;
  }
  std::string digits = std::to_string(h1) + std::to_string(h2);
  digits.resize(40, '0');
  return digits;
}

}  // namespace

void write_pt(ByteSink& sink, const pickle::Value& root, const std::vector<OutputTensor>& tensors,
              const FillTensor& fill, const std::string& archive_name) {
  RebuildBuilder builder(tensors);
  ValuePtr tree = builder.build(root);
  std::string pkl = pickle::pickle_protocol2(*tree);

  archive::ZipWriter zip(sink, archive_name);
  zip.write_record("data.pkl", pkl);
  zip.write_record(".format_version", std::string("1"));
  zip.write_record(".storage_alignment", std::string("64"));
  zip.write_record("byteorder", std::string("little"));
  const auto& order = builder.storage_order();
  for (std::size_t key = 0; key < order.size(); ++key) {
    const OutputTensor& t = tensors[order[key]];
    uint64_t nbytes = shape_numel(t.shape) * dtype_size(t.dtype);
    zip.begin_record("data/" + std::to_string(key), nbytes);
    fill(order[key], zip);
    zip.end_record();
  }
  zip.write_record("version", std::string("3\n"));
  zip.write_record(".data/serialization_id", serialization_id(pkl));
  zip.finish();
}

}  // namespace ckpt::torch_pt
