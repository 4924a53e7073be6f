#include "exec/parted_writer.h"

#include "archive/zip_writer.h"
#include "core/error.h"
#include "io/storage.h"

namespace ckpt {

void refuse_existing(const PartedWriter& w) {
  for (const auto& d : w.destinations())
    if (path_exists(d)) fail_invalid(d + ": output exists (use --force to overwrite)");
}

void skip_unit(const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip, uint32_t crc) {
  if (zip)
    zip->append_elsewhere(u.nbytes, crc);
  else
    sink.skip(u.nbytes);
}

// All of a unit's bytes, at the sink's position.
void write_unit(const PartUnit& u, ByteSink& sink, archive::ZipWriter* zip, const CopyOptions& copy) {
  if (u.tensor && zip)
    append_tensor(*u.tensor, *zip, copy);
  else if (u.tensor)
    append_tensor(*u.tensor, sink, copy);
  else if (zip)
    zip->append(u.bytes.data(), u.bytes.size());
  else
    sink.write(u.bytes.data(), u.bytes.size());
}

}  // namespace ckpt
