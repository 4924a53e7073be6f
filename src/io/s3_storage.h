// The S3 backend of io/storage.h, defined in io/s3_backend.cc: s3://BUCKET/PREFIX
// names objects, and "directories" are the prefixes that have keys below
// them. stat is a HEAD (or a one-key listing for a prefix), list is
// ListObjectsV2 with the delimiter '/', open is a ByteSource of ranged
// GETs. Inputs do not change during a run, so listings and stats are
// remembered for the process.
//
// Like io/local_files.h, this header names Storage without including
// io/storage.h: storage.cc includes it to pick the backend, and the
// backend includes storage.h, so neither header includes the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

class Storage;

// The backend storage_for() picks for every s3:// path.
const Storage& s3_storage();

// Every object below the prefix `dir` (s3://BUCKET/PREFIX, all levels), as
// s3:// URLs, listed now (not the run's remembered listing): what an output
// replaced with --force had that the new one does not.
std::vector<std::string> s3_objects_below(const std::string& dir);

// The bytes that objects read front to back may hold fetched ahead of
// their readers, all together (MemoryBudget::read_ahead; set by the job
// before it reads). 0 turns read-ahead off.
void set_s3_read_ahead_budget(uint64_t bytes);

}  // namespace ckpt
