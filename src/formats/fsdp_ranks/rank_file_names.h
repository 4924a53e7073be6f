// Moved to formats/rank_file_names.h: per-rank file names are read by
// detect, fsdp_ranks and fsdp_flat alike, so they live beside them rather
// than in one of them (fsdp_flat including fsdp_ranks, which includes
// fsdp_flat, was an include cycle). Kept for includers outside src/formats
// (jobs/reshard.cc) until they name the new header.
#pragma once

#include "formats/rank_file_names.h"
