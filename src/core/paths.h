// Lexical path arithmetic: the parts of a name and names joined, without
// asking the file system anything (the storage layer, io/storage.h, does
// that). One place for it, so that code outside io/ names no
// std::filesystem at all and a backend's names (s3://bucket/key) go
// through the same few functions.
#pragma once

#include <string>

namespace ckpt {

std::string file_name(const std::string& path);                          // "a/b.pt" -> "b.pt"
std::string file_stem(const std::string& path);                          // "a/b.pt" -> "b"
std::string file_extension(const std::string& path);                     // "a/b.pt" -> ".pt"; "" without one
std::string parent_dir(const std::string& path);                         // "a/b.pt" -> "a"; "" for "b.pt"
std::string path_join(const std::string& dir, const std::string& name);  // "a" + "b.pt" -> "a/b.pt"

}  // namespace ckpt
