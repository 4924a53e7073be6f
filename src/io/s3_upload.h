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
#include <deque>
#include <future>
#include <memory>
#include <optional>
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

// At most this many parts of one upload on the wire at once...
inline constexpr unsigned kS3MaxPartsOnTheWire = 4;
// ...and as many as `budget` bytes of memory hold besides the part being
// filled, each a buffer of part_size bytes (0: the writer waits for each).
unsigned s3_parts_on_the_wire(uint64_t budget, uint64_t part_size);

// A part of a multipart upload, sent: its number (from 1) and ETag.
struct S3UploadedPart {
  uint64_t number = 0;
  std::string etag;
};

// Streams bytes into one multipart upload: a part buffer, growing to
// part_size bytes (a file smaller than a part holds only its size), goes up
// as one UploadPart whenever it is full. With `parts_on_the_wire` 0 the
// writer waits for each part; with n > 0 up to n full parts go up in the
// background while the next one fills (n + 1 part buffers at most), and the
// writer waits only when n are on the wire.
class S3UploadSink final : public ByteSink {
 public:
  // Starts the upload (CreateMultipartUpload) of the object at `url`.
  S3UploadSink(const std::string& url, uint64_t part_size, unsigned parts_on_the_wire = 0);
  // Aborts the upload unless complete() succeeded; never throws.
  ~S3UploadSink() override;
  S3UploadSink(const S3UploadSink&) = delete;
  S3UploadSink& operator=(const S3UploadSink&) = delete;

  using ByteSink::write;
  void write(const void* data, std::size_t n) override;
  uint64_t position() const override { return position_; }
  // Reads straight into the part buffer: no second copy of the bytes.
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override;
  // Uploads what is buffered as the last part, waits for every part on the
  // wire, and frees the buffers; the object is still invisible. A later
  // write is an Internal error.
  void close();
  // close(), then CompleteMultipartUpload: the object appears whole.
  void complete(bool overwrite);
  // AbortMultipartUpload, once; best effort (logged, never thrown).
  void abort() noexcept;

  const std::string& url() const { return url_; }

 private:
  // A full part being uploaded in the background, and its bytes.
  struct OnTheWire {
    std::size_t index = 0;  // into parts_
    std::future<std::string> etag;
    std::vector<char> bytes;
  };

  void reserve_for(std::size_t n);
  void upload_part();
  // Waits for the oldest part on the wire: its ETag recorded, its buffer
  // returned (for the next part). Rethrows its failure.
  std::vector<char> land_oldest();
  // Waits for every part on the wire; the first failure is rethrown once
  // none is left running (their buffers are theirs until then).
  void land_all();

  S3Url where_;
  std::string url_;
  std::string upload_id_;
  uint64_t part_size_;
  unsigned parts_on_the_wire_;
  std::vector<char> buffer_;  // the part being filled
  uint64_t position_ = 0;
  std::vector<S3UploadedPart> parts_;  // 1, 2, ...; an ETag is empty while its part is on the wire
  std::deque<OnTheWire> wire_;         // oldest first
  bool closed_ = false;
  bool done_ = false;  // completed or aborted
};

// One PUT of `bytes` at `url`, visible at once (the small file that
// publishes an output); If-None-Match: * unless `overwrite`.
void s3_put_object(const std::string& url, const std::string& bytes, bool overwrite);
// The same PUT with If-None-Match: *, false when another object is there
// already: one of several workers racing to create a name wins. `bytes`
// must be unique to the caller (a try whose answer was lost is told from
// another writer's object by them).
bool s3_put_new_object(const std::string& url, const std::string& bytes);
// The object's bytes, read now (not the run's remembered listing: state
// other processes change); nullopt when there is none. For small objects.
std::optional<std::string> s3_get_object(const std::string& url);

// The steps of a multipart upload that several processes share (a --part
// output: exec/object_store_parts.h). Part numbers need not be consecutive;
// the completion lists them in ascending order.
// CreateMultipartUpload: the new upload's id.
std::string s3_create_upload(const std::string& url);
// UploadPart: the part's ETag.
std::string s3_upload_part(const std::string& url, const std::string& upload_id, uint64_t number, const char* data,
                           std::size_t n);
// CompleteMultipartUpload (If-None-Match: * unless `overwrite`): the object
// appears. A 412 or 404 answer is checked against the object's ETag (an
// earlier try may have completed it and lost the answer) before it is
// "output exists" (exit 2) or a failure (exit 4).
void s3_complete_upload(const std::string& url, const std::string& upload_id, const std::vector<S3UploadedPart>& parts,
                        bool overwrite);
// AbortMultipartUpload; best effort (logged, never thrown), sent even
// after Ctrl-C. True when the upload is gone.
bool s3_abort_upload(const std::string& url, const std::string& upload_id) noexcept;
// DeleteObject, to undo an output; best effort, sent even after Ctrl-C.
bool s3_delete_object(const std::string& url) noexcept;

}  // namespace ckpt
