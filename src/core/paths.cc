#include "core/paths.h"

#include <filesystem>

namespace ckpt {

namespace fs = std::filesystem;

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }
std::string file_stem(const std::string& path) { return fs::path(path).stem().string(); }
std::string file_extension(const std::string& path) { return fs::path(path).extension().string(); }
std::string parent_dir(const std::string& path) { return fs::path(path).parent_path().string(); }
std::string path_join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

}  // namespace ckpt
