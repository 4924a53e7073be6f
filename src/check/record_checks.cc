#include "check/record_checks.h"

#include <cstdio>

#include "archive/zip_writer.h"

namespace ckpt::check {

RecordChecks::RecordChecks(const CheckpointModel& model, const std::set<std::size_t>& vouched) {
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    if (vouched.count(i)) continue;
    const TensorEntry& t = model.tensors[i];
    for (const auto& c : t.chunks) {
      if (!c.storage_crc || !c.storage || index_.count(c.storage.get())) continue;
      index_[c.storage.get()] = records_.size();
      records_.push_back({&c, t.name});
    }
  }
}

bool RecordChecks::claim(const ByteSource* record) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(record);
  if (it == index_.end() || records_[it->second].claimed) return false;
  records_[it->second].claimed = true;
  return true;
}

// The message pt_reader's verify_records gives for the same mismatch.
void RecordChecks::done(const ByteSource* record, uint32_t crc) {
  const Record& r = records_.at(index_.at(record));
  const TensorChunk& c = *r.chunk;
  if (crc == *c.storage_crc) return;
  char got[16], want[16];
  std::snprintf(got, sizeof got, "0x%08x", crc);
  std::snprintf(want, sizeof want, "0x%08x", *c.storage_crc);
  std::lock_guard<std::mutex> lock(mutex_);
  problems_.report(Problem{ErrorCode::kDataLoss,
                           c.file + ": entry '" + c.record + "': CRC-32 mismatch (directory says " + want +
                               ", data has " + got + "); the record holds tensor '" + r.tensor + "'" +
                               (c.rank >= 0 ? " (rank " + std::to_string(c.rank) + ")" : std::string()),
                           c.file, c.rank, r.tensor});
}

void RecordChecks::check_remaining() {
  for (std::size_t i = records_.size(); i-- > 0;) {
    const TensorChunk& c = *records_[i].chunk;
    if (!claim(c.storage.get())) continue;
    ProblemSink failed;
    uint32_t crc = 0;
    bool read =
        run_reporting(&failed, c.file, c.rank, records_[i].tensor, [&] { crc = archive::crc32_of(*c.storage, 1); });
    if (read) {
      done(c.storage.get(), crc);
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& p : failed.problems()) problems_.report(p);
  }
}

}  // namespace ckpt::check
