// The input files ckptconv reads through mmap, for the SIGBUS handler: a
// file truncated while it is mapped (a checkpoint rewritten by a job still
// running) makes every read of its lost pages a SIGBUS, which killed the
// tool ("Bus error", exit 135). The handler replaces the rest of that
// mapping with zero pages, so the read goes on, and notes the file
// (core/interrupt.h note_input_shrank): the job stops with DataLoss at its
// next check, before any output is published. A SIGBUS outside these
// mappings goes to the handler that was there before (a sanitizer's, or the
// default action).
#pragma once

#include <cstddef>
#include <string>

namespace ckpt {

// Registers a mapping of `path`; returns its slot, or -1 when every slot is
// taken (that mapping then has no protection). Installs the handler once.
int register_mapped_input(const void* base, std::size_t length, const std::string& path);
void unregister_mapped_input(int slot);

// A write() or pwrite() of bytes that lay in a mapped input failed with
// `err`: EFAULT there means the input lost those pages (the kernel fails
// the call instead of raising SIGBUS), so it is that input's DataLoss, as
// for a read, not the output's failure. Returns when it is not that.
void check_write_source(const void* data, int err);

}  // namespace ckpt
