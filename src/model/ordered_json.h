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

// Every JSON a checkpoint carries (a safetensors index, megatron-core's
// metadata.json, DCP_SHARDING_INFO, HDF5 value attributes, manifests,
// config.json) goes through this one parse: linear in the text, at most
// kCheckpointJsonMaxBytes of it and kCheckpointJsonMaxDepth levels, so no
// file can make a reader quadratic or deep where another reader is not.
// Objects keep every member in order; callers look members up through an
// index of their own (JsonMembers), never by ordered_json's linear find.
inline constexpr std::size_t kCheckpointJsonMaxBytes = std::size_t{100} << 20;
inline constexpr std::size_t kCheckpointJsonMaxDepth = 64;
nlohmann::ordered_json parse_checkpoint_json(std::string_view text, const std::string& what);

// An object's members by key, built once in O(n): ordered_json's own find
// and contains search linearly, so looking up each of n members is O(n^2).
// A key given twice is DataLoss naming `what` (a JSON object has each key
// once; the last-wins rule of other parsers would hide one of them).
class JsonMembers {
 public:
  JsonMembers(const nlohmann::ordered_json& object, const std::string& what);
  const nlohmann::ordered_json* find(const std::string& key) const;
  std::size_t size() const { return index_.size(); }

 private:
  std::unordered_map<std::string_view, const nlohmann::ordered_json*> index_;
};

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
