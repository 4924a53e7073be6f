#include "exec/object_store_publish.h"

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/byte_source.h"
#include "io/s3_storage.h"
#include "io/s3_upload.h"
#include "io/s3_url.h"

namespace ckpt {

Published publish_uploads(PartedWriter& w, const PartedOptions& options,
                          const std::function<void(std::size_t k, bool overwrite)>& complete) {
  const std::vector<MarkerFile> markers = w.marker_files();
  const std::size_t count = w.file_names().size();
  // A folder output (DCP, rank files) replaced with --force: S3 cannot swap
  // a prefix in one step as a local rename does. The old marker goes first,
  // so that no reader takes the old folder for a checkpoint while its files
  // are replaced one by one, and after the new marker the old objects the
  // new output has no use for (a larger world size's rank files).
  const std::vector<std::string> dests = w.destinations();
  const bool folder = dests.size() == 1 && (count == 0 || dests[0] != w.output_path(0));
  if (options.force)
    for (const auto& m : markers)
      if (!m.replace && !s3_delete_object(m.path))  // S3 answers 204 for a key that is not there
        fail(ErrorCode::kOutputFailed, m.path + ": cannot remove the marker of the output --force replaces");
  std::vector<std::string> published;
  try {
    for (std::size_t k = 0; k < count; ++k) {
      complete(k, options.force);
      published.push_back(w.output_path(k));
    }
    for (const auto& m : markers) {
      if (m.from_file.empty()) {
        s3_put_object(m.path, m.bytes, options.force || m.replace);
      } else {
        SourcePtr from = open_file_source(m.from_file);
        S3UploadSink sink(m.path, s3_part_size(from->size()));
        sink.copy_from(*from, 0, from->size());
        sink.complete(options.force || m.replace);
      }
      published.push_back(s3_url_string(parse_s3_url(m.path)));
    }
    if (options.publish_beside) options.publish_beside(published);
  } catch (const Error&) {
    for (const auto& url : published) s3_delete_object(url);
    throw;
  }
  if (options.force && folder) {
    const std::set<std::string> kept(published.begin(), published.end());
    for (const auto& url : s3_objects_below(dests[0]))
      if (!kept.count(url)) s3_delete_object(url);
  }
  return {published, std::to_string(published.size()) + (published.size() == 1 ? " object" : " objects")};
}

}  // namespace ckpt
