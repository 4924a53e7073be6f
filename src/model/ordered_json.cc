#include "model/ordered_json.h"

#include <utility>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;

// nlohmann's SAX interface, building the document as its DOM parser does but
// appending object members instead of inserting them by key.
class AppendingBuilder {
 public:
  explicit AppendingBuilder(std::size_t max_depth) : max_depth_(max_depth) {}

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(Json::number_integer_t v) { return add(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return add(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return add(v); }
  bool string(Json::string_t& v) { return add(std::move(v)); }
  bool binary(Json::binary_t& v) { return add(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool key(Json::string_t& k) {
    open_.back().key = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    return false;
  }

  Json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  struct Open {
    Json* container;
    std::string key;  // the member being read, in an object
  };

  // Where the next value goes; returns it. The containers on the open path
  // are never appended to while a child of theirs is open, so the pointers
  // held in open_ stay valid.
  Json* place(Json&& value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *open_.back().container;
    if (parent.is_array()) {
      parent.get_ref<Json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<Json::array_t&>().back();
    }
    auto& members = parent.get_ref<Json::object_t&>();
    members.push_back({std::move(open_.back().key), std::move(value)});
    return &members.back().second;
  }
  bool add(Json&& value) {
    place(std::move(value));
    return true;
  }
  bool open(Json&& container) {
    if (open_.size() >= max_depth_) {
      error_ = "nests deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    Json* at = place(std::move(container));
    open_.push_back({at, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::size_t max_depth_;
  Json root_;
  std::vector<Open> open_;
  std::string error_;
};

}  // namespace

Json parse_ordered_json(std::string_view text, std::size_t max_depth, const std::string& what) {
  // nlohmann's lexer takes a NUL byte for the end of its input, so
  // '{...}\0<anything>' parsed as the part before it; JSON has no raw NUL
  // (not between tokens, not in a string), and safetensors, json.loads and
  // transformers refuse it: a safetensors header ending in NULs was VALID.
  if (std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail_data_loss(what + " is not valid JSON: a NUL byte at offset " + std::to_string(nul));
  AppendingBuilder builder(max_depth);
  bool ok = Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json, true);
  if (!ok) fail_data_loss(what + " is not valid JSON" + (builder.error().empty() ? "" : ": " + builder.error()));
  return std::move(builder.root());
}

Json parse_checkpoint_json(std::string_view text, const std::string& what) {
  if (text.size() > kCheckpointJsonMaxBytes)
    fail_data_loss(what + " is " + std::to_string(text.size()) + " bytes of JSON, more than the " +
                   std::to_string(kCheckpointJsonMaxBytes) + " ckptconv reads");
  return parse_ordered_json(text, kCheckpointJsonMaxDepth, what);
}

JsonMembers::JsonMembers(const Json& object, const std::string& what) {
  if (!object.is_object()) fail_data_loss(what + " is not a JSON object");
  const auto& members = object.get_ref<const Json::object_t&>();
  index_.reserve(members.size());
  for (const auto& [key, value] : members)
    if (!index_.emplace(key, &value).second) fail_data_loss(what + " names '" + key.substr(0, 200) + "' twice");
}

const Json* JsonMembers::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second;
}

void append_member(Json& object, std::string key, Json value) {
  object.get_ref<Json::object_t&>().push_back({std::move(key), std::move(value)});
}

void OrderedObjectBuilder::set(const std::string& key, Json value) {
  auto& members = object_.get_ref<Json::object_t&>();
  auto [it, fresh] = index_.emplace(key, members.size());
  if (fresh)
    members.push_back({key, std::move(value)});
  else
    (members.begin() + static_cast<std::ptrdiff_t>(it->second))->second = std::move(value);
}

}  // namespace ckpt
