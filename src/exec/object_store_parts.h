// --part I/N with an s3:// OUT: N workers, on any number of nodes, write
// one output through one multipart upload per file of it, and no process
// holds a file whole. (docs/object-storage.md, "--part over a bucket")
//
// The shared state is a prefix beside OUT, OUT.parts-<plan hash>/, as a
// local run's parts folder: every worker can reach the bucket, and nothing
// else need be shared. In it:
//   uploads.json         the UploadId of each file's upload: the first
//                        worker to put it (a PUT with If-None-Match: *)
//                        wins, a worker that lost the race aborts the
//                        uploads it began and uses the winner's;
//   request.json         the job's request, for `--part finalize`;
//   stash-<k>-<n>        part n of file k, uploaded by its worker as an
//                        object because some of its bytes only the
//                        finalizer knows (below);
//   part-I-of-N.json     worker I's receipt: the ETag of each part it
//                        uploaded, its stashes, and the CRC-32 of its
//                        share of each zip record;
//   finalizing           the exclusive create that elects the finalizer.
//
// Shares are cut at part boundaries: each file is cut into parts of
// s3_part_size(file size) (8 MiB up to 80 GB), and part n belongs to the
// worker whose share of all the output's bytes holds its middle byte, so a
// worker's parts are consecutive and every part but a file's last is of
// full size (S3 refuses parts under 5 MiB but the last). The worker runs
// the writer over the whole output (as a local worker does) and keeps the
// bytes of its parts: headers, and the stored tensors whose bytes fall in
// them (the rows covering its share of a tensor that spans a boundary).
// A zip writer's data descriptor and central directory hold CRC-32s of
// records; a part that holds such bytes for a record not all in this
// worker's parts cannot be right yet, so it goes up as a stash object, and
// the finalizer, who joins the CRC-32s from the receipts, runs the writer
// once more without tensor bytes, patches the stashes' metadata bytes, and
// uploads them as their parts (at most one part at each boundary between
// two workers and at each file's end: a few parts, whatever the size).
// It then completes the uploads in order, puts the markers (a DCP
// .metadata, a safetensors index) last, and removes the prefix.
//
// Until then no object of the output is visible. A worker that fails or is
// killed leaves its parts in the shared uploads (rerunning it replaces
// them); `--part abort` aborts the uploads and removes the prefix.
#pragma once

#include "exec/part_layout.h"

namespace ckpt {

// write_parted (exec/part_protocol.h, which calls it) for an s3:// OUT, `l` its plan.
// Exit 3 (DataLoss) when finalizing finds a receipt missing or not of this
// plan, naming the parts to rerun; exit 4 when a request fails.
PartOutcome write_parted_to_object_store(PartedWriter& w, const PartedOptions& options, const PartSpec& part,
                                         const part_plan::Layout& l);

}  // namespace ckpt
