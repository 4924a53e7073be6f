// validate's CRC-32 check of the records tensors are read from, done while
// its data pass reads them anyway (readers leave these records to it:
// ProblemSink::tensor_records_checked_later). The scan's workers share the
// list: a worker checks a record whose bytes it streams whole (summing the
// same buffer it scans, so the bytes are read once), and workers with no
// tensor left check the rest from the other end of the list. Each record
// is claimed by exactly one of them.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/problems.h"
#include "model/checkpoint_model.h"

namespace ckpt::check {

class RecordChecks {
 public:
  // Every record with a recorded CRC-32 the model's tensors read from, in
  // tensor order, each once; none of the tensors in `vouched` (their files
  // match a manifest written when every record checked: validate --manifest).
  explicit RecordChecks(const CheckpointModel& model, const std::set<std::size_t>& vouched = {});

  // True when the caller now owns the check of `record` (a chunk's storage
  // on the list, not yet claimed); it must then call done() with its CRC.
  bool claim(const ByteSource* record);
  // The CRC-32 of all of a claimed record's bytes: a mismatch is reported.
  void done(const ByteSource* record, uint32_t crc);

  // Checks every record not claimed yet, from the end of the list back, on
  // the calling thread; several threads may call it at once.
  void check_remaining();

  // The mismatches and read failures found; call once both workers are done.
  const ProblemSink& problems() const { return problems_; }

 private:
  struct Record {
    const TensorChunk* chunk;
    std::string tensor;
    bool claimed = false;
  };
  std::vector<Record> records_;
  std::unordered_map<const ByteSource*, std::size_t> index_;
  std::mutex mutex_;
  ProblemSink problems_;
};

}  // namespace ckpt::check
