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

namespace ckpt {

class Storage;

// The backend storage_for() picks for every s3:// path.
const Storage& s3_storage();

}  // namespace ckpt
