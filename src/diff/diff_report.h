// A DiffReport for people (a table) and for programs (JSON, schema in
// docs/json-schema.md and docs/schema/diff.schema.json).
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

#include "diff/checkpoint_diff.h"

namespace ckpt {

constexpr int kDiffSchemaVersion = 1;

// The differences, then a one-line verdict. `all_tensors` also lists the
// tensors that are equal within tolerance, with their max differences.
void print_diff_table(const DiffReport& report, std::ostream& out, bool all_tensors = false);
// diff --summary: the same header, counts instead of lists, and the `worst`
// differing tensors (shape differences first, then by max abs diff).
void print_diff_summary(const DiffReport& report, std::ostream& out, std::size_t worst = 10);

nlohmann::ordered_json diff_to_json(const DiffReport& report);

// A double as JSON: a number when finite, else "nan", "inf" or "-inf".
nlohmann::ordered_json number_json(double v);

}  // namespace ckpt
