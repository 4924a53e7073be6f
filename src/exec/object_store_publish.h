// The last step of every s3:// output, one process's (exec/parted_output.h)
// or the --part finalizer's (exec/object_store_parts.h): its files'
// uploads completed in order, then its marker files put.
#pragma once

#include <cstddef>
#include <functional>

#include "exec/parted_writer.h"

namespace ckpt {

// Publishes an s3:// output whose files are uploaded, not yet completed:
// `complete(k, overwrite)` completes file k's upload (the object appears),
// in order, then the writer's marker files are put, the one that makes the
// output a checkpoint last, then options.publish_beside. With --force a folder's old marker goes first
// and its stale objects after; a failure deletes what was published.
Published publish_uploads(PartedWriter& writer, const PartedOptions& options,
                          const std::function<void(std::size_t k, bool overwrite)>& complete);

}  // namespace ckpt
