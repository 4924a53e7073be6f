// The writers the layout table (jobs/layouts.cc) names, defined in
// jobs/reshard.cc: each plans its layout and hands the plan's writer to one
// shared tail (--dry-run's listing, or the size check, progress and the
// write).
#pragma once

#include "jobs/layout_job.h"

namespace ckpt::jobs {

void write_dcp_layout(const LayoutJob& job);              // dcp
void write_hf_layout(const LayoutJob& job);               // hf
void write_rank_files_layout(const LayoutJob& job);       // fsdp-sharded-tensor, fsdp-dtensor
void write_accelerate_layout(const LayoutJob& job);       // accelerate
void write_universal_layout(const LayoutJob& job);        // deepspeed-universal
void write_fsdp1_flat_layout(const LayoutJob& job);       // fsdp1-flat
void write_megatron_layout(const LayoutJob& job);         // megatron
void write_megatron_legacy_layout(const LayoutJob& job);  // megatron-legacy

}  // namespace ckpt::jobs
