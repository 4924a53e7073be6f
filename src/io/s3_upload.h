// The output side of the S3 backend: a file output is one multipart upload
// (CreateMultipartUpload, UploadPart, CompleteMultipartUpload) that no
// reader sees until it is completed, and that is aborted when the run
// fails, is interrupted, or drops the sink unfinished. Small files that
// publish a larger output (DCP's .metadata, a safetensors index) are one
// PUT. Without `overwrite` both carry `If-None-Match: *`, so an object that
// appeared meanwhile is never replaced (where the service supports
// conditional writes: AWS since 2024, MinIO, moto). Failures are OutputFailed
// (exit 4) naming the s3:// URL; an existing object is InvalidArgument
// ("output exists", exit 2), as for a local output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/byte_sink.h"
#include "io/s3_url.h"

namespace ckpt {

// Parts are at least this large (S3's minimum is 5 MiB for every part but
// the last)...
inline constexpr uint64_t kS3MinPartSize = 8u << 20;
// ...and an upload has at most 10,000 of them.
inline constexpr uint64_t kS3MaxParts = 10000;
// The part size for an object of `size` bytes: kS3MinPartSize, or larger
// (whole MiB) when the object needs more than kS3MaxParts of those.
uint64_t s3_part_size(uint64_t size);

// Streams bytes into one multipart upload: a part buffer, growing to
// part_size bytes (the only memory it holds: a file smaller than a part
// holds only its size), goes up as one UploadPart whenever it is full.
// One part is on the wire at a time, and the writer waits for it.
class S3UploadSink final : public ByteSink {
 public:
  // Starts the upload (CreateMultipartUpload) of the object at `url`.
  S3UploadSink(const std::string& url, uint64_t part_size);
  // Aborts the upload unless complete() succeeded; never throws.
  ~S3UploadSink() override;
  S3UploadSink(const S3UploadSink&) = delete;
  S3UploadSink& operator=(const S3UploadSink&) = delete;

  using ByteSink::write;
  void write(const void* data, std::size_t n) override;
  uint64_t position() const override { return position_; }
  // Reads straight into the part buffer: no second copy of the bytes.
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override;
  // Uploads what is buffered as the last part and frees the buffer; the
  // object is still invisible. A later write is an Internal error.
  void close();
  // close(), then CompleteMultipartUpload: the object appears whole.
  void complete(bool overwrite);
  // AbortMultipartUpload, once; best effort (logged, never thrown).
  void abort() noexcept;

  const std::string& url() const { return url_; }

 private:
  void reserve_for(std::size_t n);
  // The object at the key is the one this upload's parts make (its ETag).
  bool completed_by_this_upload() const;
  void upload_part();

  S3Url where_;
  std::string url_;
  std::string upload_id_;
  uint64_t part_size_;
  std::vector<char> buffer_;  // the part being filled
  uint64_t position_ = 0;
  std::vector<std::string> etags_;  // of parts 1, 2, ...
  bool closed_ = false;
  bool done_ = false;  // completed or aborted
};

// One PUT of `bytes` at `url`, visible at once (the small file that
// publishes an output); If-None-Match: * unless `overwrite`.
void s3_put_object(const std::string& url, const std::string& bytes, bool overwrite);
// DeleteObject, to undo an output; best effort, sent even after Ctrl-C.
bool s3_delete_object(const std::string& url) noexcept;

}  // namespace ckpt
