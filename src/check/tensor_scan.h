// One pass over a tensor's values: its logical bytes (global shape,
// row-major, stored dtype), assembled from its chunks by the executor's copy
// (exec/tensor_copy.h, bounded by the memory limit, mapped pages released
// after each tensor) and fed to the Backend's finite scan and/or a checksum.
// Because the bytes are the logical ones, a tensor has the same checksum in
// every layout: a DCP directory, its consolidated .pt, a resharded copy.
#pragma once

#include <optional>
#include <string>

#include "check/file_streams.h"
#include "check/record_checks.h"
#include "exec/backend.h"
#include "exec/checksum.h"
#include "model/checkpoint_model.h"

namespace ckpt::check {

struct TensorScan {
  std::optional<FiniteCounts> finite;  // when a backend was given and the dtype is floating or complex
  std::string checksum;                // when an algorithm was given
};

// `tensor` must have passed visit_tensor_problems() (chunks inside storage, exact cover).
// With `records`, a record whose bytes the scan streams whole is also
// CRC-checked from the same buffer, when the scan claims it first; with
// `files`, every slice read from a file is also fed to its file checksum.
TensorScan scan_tensor(const TensorEntry& tensor, Backend* finite_backend, std::optional<ChecksumAlgorithm> checksum,
                       uint64_t memory_limit, RecordChecks* records = nullptr, FileStreams* files = nullptr);

// True for the dtypes that can hold NaN or Inf.
bool can_be_nonfinite(DType dtype);

}  // namespace ckpt::check
