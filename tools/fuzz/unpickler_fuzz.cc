// libFuzzer target: any byte string must unpickle to a value or fail with a
// ckpt::Error; never crash, hang, leak or exhaust memory. The result is also
// rendered and pickled again, to exercise repr and the pickler on what the
// unpickler accepts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "fuzz_oracle.h"
#include "pickle/pickler.h"
#include "pickle/policy.h"
#include "pickle/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ckpt::pickle::UnpickleLimits limits;
  limits.max_total_values = 1u << 20;  // keep each run small; the limits themselves are unit-tested
  try {
    ckpt::pickle::ValuePtr value = ckpt::pickle::unpickle(bytes, ckpt::pickle::checkpoint_policy(), limits);
    (void)value->repr();
    (void)ckpt::pickle::pickle_protocol2(*value);
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
  return 0;
}
