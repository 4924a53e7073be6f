// libFuzzer target for DCP .metadata: the pickle under the checkpoint policy,
// then its interpretation (items, chunks, planner_data, storage) and the flat
// layout reshard keeps. Any input must parse or be refused with a
// ckpt::Error; crashes, sanitizer reports and other exceptions are bugs.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "formats/dcp/dcp_metadata.h"
#include "fuzz_oracle.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto root = ckpt::pickle::unpickle(std::string_view(reinterpret_cast<const char*>(data), size),
                                       ckpt::pickle::checkpoint_policy());
    ckpt::dcp::DcpMetadata md = ckpt::dcp::parse_metadata(*root);
    ckpt::dcp::metadata_of(ckpt::dcp::flat_layout_of(md));
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
