#include "formats/hdf5/hdf5_structure.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/checked.h"
#include "core/error.h"
#include "model/ordered_json.h"
#include "pickle/encodings.h"

namespace ckpt::hdf5 {
namespace {

using Json = nlohmann::json;
// What the child sent, read as every JSON a checkpoint carries
// (model/ordered_json.h parse_checkpoint_json: bounded size and depth).
using InJson = nlohmann::ordered_json;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The tree travels as a table of nodes, children before their parents, the
// root last; a node names its children by their index in the table. A value
// reached by several paths (hard-linked groups, the shared constants) is one
// node, so the message is as large as the graph, not as the tree it expands
// to, and an index below the node's own cannot make a cycle.
//   ["n"]  ["b", bool]  ["i", int]  ["f", number | "nan" | "inf" | "-inf"]
//   ["s", text]  ["T", tensor index]  ["l", [ids]]  ["u", [ids]] (a tuple)
//   ["d", [[key id, value id], ...]]
// JSON carries UTF-8 text only; ckptconv writes names and values as UTF-8,
// so other bytes in one are a corrupt file.
const std::string& utf8(const std::string& text, const std::string& what) {
  if (!pickle::is_valid_utf8(text)) fail_data_loss(what + " that is not UTF-8: " + printable_text(text));
  return text;
}

class NodeTable {
 public:
  std::size_t add(const ValuePtr& v) {
    if (auto it = ids_.find(v.get()); it != ids_.end()) return it->second;
    Json node = encode(*v);
    ids_.emplace(v.get(), nodes_.size());
    nodes_.push_back(std::move(node));
    return nodes_.size() - 1;
  }
  Json take() { return std::move(nodes_); }

 private:
  Json encode(const Value& v) {
    if (auto index = tensor_ref_index(v)) return {"T", *index};
    switch (v.kind) {
      case Kind::kNone: return {"n"};
      case Kind::kBool: return {"b", v.bool_value};
      case Kind::kInt: return {"i", v.int_value};
      case Kind::kFloat:
        if (std::isnan(v.float_value)) return {"f", "nan"};
        if (std::isinf(v.float_value)) return {"f", v.float_value > 0 ? "inf" : "-inf"};
        return {"f", v.float_value};
      case Kind::kStr: return {"s", utf8(v.text, "a key or text value")};
      case Kind::kList:
      case Kind::kTuple: {
        Json ids = Json::array();
        for (const auto& item : v.items) ids.push_back(add(item));
        return {v.kind == Kind::kList ? "l" : "u", std::move(ids)};
      }
      case Kind::kDict: {
        Json pairs = Json::array();
        for (const auto& [key, value] : v.entries) pairs.push_back({add(key), add(value)});
        return {"d", std::move(pairs)};
      }
      default:
        fail(ErrorCode::kInternal, std::string("the HDF5 reader made a ") + pickle::kind_name(v.kind) +
                                       " value, which its structure message cannot carry");
    }
  }

  std::unordered_map<const Value*, std::size_t> ids_;
  Json nodes_ = Json::array();
};

// Reading the message: every check names what the child got wrong.
[[noreturn]] void bad(const std::string& what) { fail_data_loss("the HDF5 reader process sent " + what); }

const InJson& field(const InJson& object, const char* name, InJson::value_t type) {
  auto it = object.find(name);
  if (it == object.end() || it->type() != type) bad(std::string("a message without a valid '") + name + "'");
  return *it;
}

int64_t integer(const InJson& j, const char* what) {
  if (j.is_number_integer() && (!j.is_number_unsigned() || j.get<uint64_t>() <= INT64_MAX)) return j.get<int64_t>();
  bad(std::string("a ") + what + " that is not an integer");
}

std::size_t id(const InJson& j, std::size_t below) {
  int64_t v = integer(j, "node id");
  if (v < 0 || static_cast<uint64_t>(v) >= below) bad("a node that names one not before it");
  return static_cast<std::size_t>(v);
}

ValuePtr decode_node(const InJson& node, const std::vector<ValuePtr>& done, std::size_t tensors) {
  if (!node.is_array() || node.empty() || !node[0].is_string() || node[0].get_ref<const std::string&>().size() != 1)
    bad("a node that is not [tag, ...]");
  char tag = node[0].get_ref<const std::string&>()[0];
  if (tag == 'n' && node.size() == 1) return Value::none();
  if (node.size() != 2) bad(std::string("a node '") + tag + "' of " + std::to_string(node.size()) + " fields");
  const InJson& arg = node[1];
  std::size_t below = done.size();
  switch (tag) {
    case 'b':
      if (!arg.is_boolean()) bad("a bool node that is not a bool");
      return Value::boolean(arg.get<bool>());
    case 'i': return Value::integer(integer(arg, "int node"));
    case 'f':
      if (arg.is_number()) return Value::floating(arg.get<double>());
      if (arg == "nan") return Value::floating(std::nan(""));
      if (arg == "inf" || arg == "-inf")
        return Value::floating(arg == "inf" ? std::numeric_limits<double>::infinity()
                                            : -std::numeric_limits<double>::infinity());
      bad("a float node that is not a number");
    case 's':
      if (!arg.is_string()) bad("a str node that is not a string");
      return Value::str(arg.get<std::string>());
    case 'T': {
      int64_t index = integer(arg, "tensor index");
      if (index < 0 || static_cast<uint64_t>(index) >= tensors) bad("a reference to a tensor it did not describe");
      return make_tensor_ref(static_cast<std::size_t>(index));
    }
    case 'l':
    case 'u': {
      if (!arg.is_array()) bad("a list node without a list of ids");
      std::vector<ValuePtr> items;
      items.reserve(arg.size());
      for (const auto& i : arg) items.push_back(done[id(i, below)]);
      return tag == 'l' ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case 'd': {
      if (!arg.is_array()) bad("a dict node without a list of pairs");
      std::vector<std::pair<ValuePtr, ValuePtr>> entries;
      entries.reserve(arg.size());
      for (const auto& pair : arg) {
        if (!pair.is_array() || pair.size() != 2) bad("a dict entry that is not a pair of ids");
        const ValuePtr& key = done[id(pair[0], below)];
        if (!key->is(Kind::kStr) && !key->is(Kind::kInt)) bad("a dict key that is neither str nor int");
        entries.emplace_back(key, done[id(pair[1], below)]);
      }
      return Value::dict(std::move(entries));
    }
    default: bad(std::string("a node of unknown tag '") + tag + "'");
  }
}

TensorEntry decode_tensor(const InJson& t, const std::string& path) {
  if (!t.is_object()) bad("a tensor that is not an object");
  TensorEntry entry;
  entry.name = field(t, "name", Json::value_t::string).get<std::string>();
  const auto& dtype_text = field(t, "dtype", Json::value_t::string).get_ref<const std::string&>();
  auto dtype = dtype_from_name(dtype_text);
  if (!dtype) bad("tensor '" + entry.name + "' of unknown dtype '" + dtype_text + "'");
  entry.dtype = *dtype;
  for (const auto& d : field(t, "shape", Json::value_t::array)) {
    int64_t extent = integer(d, "dimension");
    if (extent < 0) bad("tensor '" + entry.name + "' with a negative dimension");
    entry.shape.push_back(extent);
  }
  std::string size_of = "tensor '" + entry.name + "' size";
  checked_mul(shape_numel(entry.shape), dtype_size(entry.dtype), size_of.c_str());
  TensorChunk c;
  c.offsets.assign(entry.shape.size(), 0);
  c.sizes = entry.shape;
  c.strides = contiguous_strides(entry.shape);
  c.file = path;
  entry.chunks.push_back(std::move(c));
  return entry;
}

}  // namespace

std::string structure_message(const CheckpointModel& model) {
  Json facts = Json::object();
  for (const auto& [k, v] : model.facts) facts[k] = utf8(v, "a " + k + " attribute");
  Json tensors = Json::array();
  for (const auto& t : model.tensors)
    tensors.push_back(
        {{"name", utf8(t.name, "a dataset name")}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
  NodeTable table;
  if (model.root) table.add(model.root);
  Json message = {{"facts", std::move(facts)}, {"tensors", std::move(tensors)}, {"nodes", table.take()}};
  return message.dump();
}

CheckpointModel model_from_structure(const std::string& message, const std::string& path,
                                     const DatasetSourceFactory& source) {
  InJson j;
  try {
    j = parse_checkpoint_json(message, path + ": the HDF5 reader process's message");
  } catch (const Error& e) {
    bad(std::string("a message that is not a JSON object (") + e.what() + ")");
  }
  if (!j.is_object()) bad("a message that is not a JSON object");
  CheckpointModel model;
  model.source = path;
  for (const auto& [k, v] : field(j, "facts", Json::value_t::object).items()) {
    if (!v.is_string()) bad("a fact that is not a string");
    model.facts[k] = v.get<std::string>();
  }
  for (const auto& t : field(j, "tensors", Json::value_t::array)) model.tensors.push_back(decode_tensor(t, path));
  const InJson& nodes = field(j, "nodes", Json::value_t::array);
  if (nodes.empty()) bad("a message without a root");
  std::vector<ValuePtr> done;
  done.reserve(nodes.size());
  for (const auto& node : nodes) done.push_back(decode_node(node, done, model.tensors.size()));
  model.root = done.back();
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    TensorEntry& t = model.tensors[i];
    t.chunks.front().storage = source(i, t.nbytes(), t.name);
  }
  return model;
}

}  // namespace ckpt::hdf5
