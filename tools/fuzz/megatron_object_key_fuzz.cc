// libFuzzer target for the key of a megatron-core sharded object's stored
// item, KEY/shard_<offsets>_<global shape> (formats/megatron: each a
// dot-joined list of integers). The input is the key itself: it must parse
// into offsets inside a shape of at most the objects' rank limit, be
// recognised as no object key, or be refused with a ckpt::Error, in time
// linear in its length (one of 40,000 characters overflowed the stack of
// the std::regex that once matched it).
// Seeds: the object keys of testdata/megatron's .metadata files, and
// hostile ones (scripts/fuzz).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "formats/megatron/megatron_reader.h"
#include "fuzz_oracle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string key(reinterpret_cast<const char*>(data), size);
  try {
    std::optional<ckpt::megatron::ObjectShard> shard = ckpt::megatron::parse_object_key(key);
    if (!shard) return 0;
    // What the reader relies on once a key parses.
    if (shard->offsets.size() != shard->shape.size() || shard->shape.empty() ||
        shard->shape.size() > ckpt::megatron::kMaxObjectRank || shard->key.empty())
      std::abort();
    for (std::size_t d = 0; d < shard->shape.size(); ++d)
      if (shard->offsets[d] < 0 || shard->offsets[d] >= shard->shape[d]) std::abort();
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
