// Order-keeping JSON in linear time. nlohmann::ordered_json keeps member
// order but finds (and so inserts) members by linear search: parsing or
// building an object of n members costs O(n^2) — minutes for a safetensors
// header of 100,000 tensors, or a state-dict tree of 100,000 keys. These
// parse and build objects by appending instead.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace ckpt {

// Parses `text`; DataLoss naming `what` when it is not JSON or nests deeper
// than `max_depth`. Duplicate keys are all kept, in order (callers that care
// check for them, as the safetensors header does for tensor names).
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::size_t max_depth, const std::string& what);

// Appends a member to `object` without looking for an existing one: for
// keys known to be distinct (a dict's str keys).
void append_member(nlohmann::ordered_json& object, std::string key, nlohmann::ordered_json value);

// Builds an object whose keys may repeat, the last value winning as with
// operator[], but in O(1) per member.
class OrderedObjectBuilder {
 public:
  void set(const std::string& key, nlohmann::ordered_json value);
  nlohmann::ordered_json take() { return std::move(object_); }
  const nlohmann::ordered_json& get() const { return object_; }

 private:
  nlohmann::ordered_json object_ = nlohmann::ordered_json::object();
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace ckpt
