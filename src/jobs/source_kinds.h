// What the help texts say about sources, generated from the registered input
// formats (formats/registry.h): each kind's name (source_kind_name) and its
// descriptor's description, so a new format appears in every command's help
// and in `ckptconv --help` without a line of cli/.
#pragma once

#include <string>

namespace ckpt::jobs {

// Every registered kind's name, in registration order: "torch.save file,
// DCP directory, ..." (ckptconv's description).
std::string source_kind_names();

// "SRC is detected as one of:" and a line per registered format, "  <kind
// name>: <description>" (the footer of every command that reads a SRC).
std::string source_kinds_help();

// A regular file (links followed), as io/storage.h sees it: for the CLI's
// usage hints, which may not ask the storage layer itself (the layer rule).
bool is_file_path(const std::string& path);

}  // namespace ckpt::jobs
