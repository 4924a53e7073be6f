// `ckptconv diff A B`: options; the work is jobs::run_diff. Exit 0 equal,
// 1 different, 2 usage, 3 an input unreadable, corrupt or unsafe.
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "jobs/diff.h"
#include "jobs/source_kinds.h"

namespace ckpt::cli {

void register_diff(CLI::App& app) {
  auto req = std::make_shared<jobs::DiffRequest>();
  CLI::App* sub = app.add_subcommand(
      "diff",
      "Compare two checkpoints of any formats and layouts (keys, dtypes, shapes, values); exit 0 equal, 1 different");
  sub->add_option("A", req->a, "First checkpoint (of any kind listed below)")->required();
  sub->add_option("B", req->b, "Second checkpoint; relative differences are taken against B")->required();
  const char* comparison = "Comparison";
  sub->add_option("--rtol", req->rtol, "Relative tolerance (of |b|)")->capture_default_str()->group(comparison);
  sub->add_option("--atol", req->atol, "Absolute tolerance")->capture_default_str()->group(comparison);
  bind_common(sub, req->common, kOnly | kKeys | kDevice | kThreads | kMemoryLimit,
              {.only = "Compare only this top-level entry",
               .keys = "Compare only entries whose dotted path matches this regex (searched)",
               .device = "auto|cpu: comparisons run on CPU threads",
               .threads = "Threads for comparisons (0: all hardware threads)",
               .memory_limit = "Budget for the row slabs of both tensors, e.g. 512M"});
  sub->add_option("--tag", req->tag_a,
                  "A holds several checkpoints (step-100/, checkpoint_3/, DeepSpeed tags): compare this one; "
                  "'latest' for the one the file `latest` names, else the highest-numbered complete one")
      ->group(comparison);
  sub->add_option("--tag-b", req->tag_b, "The same for B")->group(comparison);
  sub->add_flag("--ignore-dtype", req->ignore_dtype,
                "A dtype difference alone is not a difference (values are still compared, in double)")
      ->group(comparison);
  sub->add_flag("--strict", req->strict,
                "A BytesIO value and its bytes differ (by default they are equal, with a note: consolidate writes "
                "a BytesIO as its bytes)")
      ->group(comparison);
  sub->add_flag("--json", req->json, "Print JSON (schema in docs/json-schema.md)")->group(kOutputGroup);
  sub->add_flag("--all", req->all, "Also list the tensors that are equal, with their max differences")
      ->group(kOutputGroup);
  sub->add_flag("--summary", req->summary,
                "Counts only, and the 10 worst differing tensors (shape differences first, then by max abs diff)")
      ->group(kOutputGroup)
      ->excludes("--all");
  set_footer(
      sub,
      {"ckptconv diff ckpt/step-1000 full.pt", "ckptconv diff a.safetensors b.safetensors --rtol 1e-3",
       "ckptconv diff ds_ckpt dcp-ws2 --only model --json"},
      "0 equal; 1 different; 2 usage error; 3 an input unreadable, corrupt or unsafe; 5 installation problem\n"
      "or internal error.",
      "Elements a (of A) and b (of B) are equal when a == b, both are NaN, or |a - b| <= atol + rtol * |b|\n"
      "(torch.isclose with equal_nan=True: relative to B). The defaults, rtol 0 and atol 0, ask for numerically\n"
      "identical values. A dtype difference is a difference unless --ignore-dtype; a shape difference always is.\n\n" +
          jobs::source_kinds_help());
  add_runner(sub, [req] { return jobs::run_diff(*req, std::cout).exit_code; });
}

}  // namespace ckpt::cli
