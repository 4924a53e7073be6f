// For fuzz targets whose parser reads files by path (HDF5 through libhdf5,
// a family of rank files): the input's bytes written into a private
// temporary directory, removed when the object goes.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "formats/detect.h"
#include "model/validate.h"
#include "fuzz_oracle.h"

namespace ckpt::fuzz {

// The inputs of the multi-file targets are records: a length (4 bytes,
// little-endian), then that many bytes, cut short at the input's end.
// Returns false when fewer than 4 bytes remain; else the record's bytes.
inline bool next_record(const uint8_t* data, std::size_t size, std::size_t& pos, const uint8_t*& bytes,
                        std::size_t& n) {
  if (size - pos < 4) return false;
  uint32_t len = uint32_t{data[pos]} | uint32_t{data[pos + 1]} << 8 | uint32_t{data[pos + 2]} << 16 |
                 uint32_t{data[pos + 3]} << 24;
  pos += 4;
  n = std::min<std::size_t>(len, size - pos);
  bytes = data + pos;
  pos += n;
  return true;
}

// What a directory target does with the files it wrote: read them as one
// checkpoint and run the coverage checks; a ckpt::Error is a refusal.
inline void read_as_checkpoint(const std::string& dir) {
  try {
    ckpt::CheckpointModel model = ckpt::read_checkpoint(dir);
    ckpt::ProblemSink sink;
    ckpt::check_model(model, sink);
  } catch (const ckpt::Error& e) {
    ckpt::fuzz::refused(e);
  }
}

// A target killed mid-input (a campaign stopped by SIGKILL, a libFuzzer
// timeout) cannot remove its directory, and a long campaign that is killed
// often fills /dev/shm. The directories carry their process's pid
// (ckpt-fuzz-<pid>-XXXXXX): the first TempDir of a run removes those whose
// process is gone.
inline void remove_dead_processes_dirs(const std::filesystem::path& tmp) {
  const std::string prefix = "ckpt-fuzz-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::size_t end = name.find('-', prefix.size());
    std::string digits = name.substr(prefix.size(), end == std::string::npos ? 0 : end - prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
  }
}

class TempDir {
 public:
  TempDir() {
    std::filesystem::path tmp = std::filesystem::temp_directory_path();
    static const bool cleaned = (remove_dead_processes_dirs(tmp), true);
    (void)cleaned;
    std::string tmpl = (tmp / ("ckpt-fuzz-" + std::to_string(::getpid()) + "-XXXXXX")).string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const uint8_t* data, std::size_t size) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return file;
  }

 private:
  std::string path_;
};

}  // namespace ckpt::fuzz
