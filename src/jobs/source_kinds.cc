#include "jobs/source_kinds.h"

#include "formats/registry.h"
#include "io/storage.h"

namespace ckpt::jobs {

std::string source_kind_names() {
  std::string out;
  for (const InputFormat* f : input_formats())
    out += (out.empty() ? "" : ", ") + std::string(source_kind_name(f->kind));
  return out;
}

std::string source_kinds_help() {
  std::string out = "SRC is detected as one of:";
  for (const InputFormat* f : input_formats())
    out += "\n  " + std::string(source_kind_name(f->kind)) + ": " + std::string(f->description);
  return out;
}

bool is_file_path(const std::string& path) { return is_regular_file(path); }

}  // namespace ckpt::jobs
