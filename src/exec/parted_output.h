// The output drivers: every writer, a file format's or a reshard layout's,
// is a PartedWriter (exec/parted_writer.h) run by one of them. write_whole
// runs it in one process; write_parted (exec/part_protocol.h, included here
// for the jobs) runs a share of it in each of many (--part), and the worker
// completing the set publishes; output_sizes runs it against counting sinks
// (--dry-run). The helpers below publish what a writer finished.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "exec/object_store_publish.h"
#include "exec/part_protocol.h"
#include "exec/parted_writer.h"
#include "model/checkpoint_model.h"

namespace ckpt {

// The options of a directory output (reshard's DCP and per-rank layouts)
// read from `model`.
PartedOptions directory_output(const std::string& dir, bool force, bool durable, const CopyOptions& copy,
                               const CheckpointModel& model, const std::string& request);

// The one-process run: every file written whole into a scratch folder
// beside OUT ("OUT.tmp-XXXXXX/", removed whatever happens: an error or an
// interrupt leaves nothing), then published by the writer as the finalizing
// worker of a parted run publishes. `inputs` and `request` are not used.
Published write_whole(PartedWriter& writer, const PartedOptions& options);

// Each of the writer's files' exact size, from a run against counting
// sinks that skips every unit's bytes (no tensor data is read): --dry-run.
std::vector<uint64_t> output_sizes(PartedWriter& writer);

// Renames finished files (at data_path(k)) onto `to`, all or none (the ones
// this call renamed are removed again when one fails); io/atomic_dir.h's
// rename_into_place for each.
void rename_all(const std::function<std::string(std::size_t)>& data_path, const std::vector<std::string>& to,
                bool force);

// For directory outputs (reshard): moves the finished files into a new
// directory for `dir` (io/atomic_dir.h) under their names (a name with '/'
// gets its folders made), lets `extra` put
// what else belongs there (DCP's .metadata) into it, and renames it into
// place.
Published publish_directory(const std::string& dir, const std::vector<std::string>& names,
                            const std::function<std::string(std::size_t)>& data_path, bool force, bool durable,
                            const std::function<void(const std::string& temp_dir)>& extra);

}  // namespace ckpt
