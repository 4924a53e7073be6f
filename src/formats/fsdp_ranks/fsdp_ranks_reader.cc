#include "formats/fsdp_ranks/fsdp_ranks_reader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "core/problems.h"
#include "formats/fsdp_flat/flat_params.h"
#include "formats/fsdp_ranks/rank_merge.h"
#include "formats/rank_file_names.h"
#include "formats/torch_pt/pt_reader.h"
#include "formats/torch_pt/sharded_values.h"
#include "io/storage.h"

namespace ckpt::fsdp_ranks {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

struct RankFile {
  std::string path;
  RankFileName name;
  CheckpointModel model;
  int content_rank = -1;        // from the chunks of its sharded values
  int content_world_size = -1;  // from their process group / device mesh
  bool unreadable = false;      // reported to the sink; its rank counts as present, its content is not merged
};

// The files whose names differ only in the rank.
struct Family {
  std::string tmpl;
  std::string kind;
  std::vector<std::pair<std::string, RankFileName>> files;
};

std::string join(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

RankFile read_rank_file(const std::string& path, const RankFileName& name, ProblemSink* sink) {
  RankFile f{path, name, {}};
  // Its errors name the file; with a sink, a file that cannot be read is
  // reported and left out of the merge, and its CRC problems get its rank.
  ProblemSink file_problems;
  if (sink) file_problems.tensor_records_checked_later = sink->tensor_records_checked_later;
  f.unreadable = !run_reporting(sink ? &file_problems : nullptr, path, name.rank, "", [&] {
    with_place({path, name.rank, ""}, [&] { f.model = torch_pt::read_pt_file(path, sink ? &file_problems : nullptr); });
  });
  for (Problem p : file_problems.problems()) {
    if (p.rank < 0) {
      p.rank = name.rank;
      p.message += " (rank " + std::to_string(name.rank) + ")";
    }
    sink->report(std::move(p));
  }
  if (f.unreadable) return f;
  std::set<int> ranks, sizes;
  for (const auto& t : f.model.tensors) {
    if (!t.is_sharded()) continue;
    if (t.world_size > 0) sizes.insert(t.world_size);
    for (const auto& c : t.chunks)
      if (c.rank >= 0) ranks.insert(c.rank);
  }
  auto list = [](const std::set<int>& s) {
    std::vector<std::string> v;
    for (int x : s) v.push_back(std::to_string(x));
    return join(v);
  };
  if (ranks.size() > 1)
    report_or_fail(sink, {ErrorCode::kDataLoss,
                          path + ": holds the shards of ranks " + list(ranks) + "; a per-rank file holds one rank's",
                          path, name.rank});
  if (sizes.size() > 1)
    report_or_fail(
        sink, {ErrorCode::kDataLoss,
               path + ": its sharded values were written by process groups of sizes " + list(sizes), path, name.rank});
  if (!ranks.empty()) f.content_rank = *ranks.begin();
  if (!sizes.empty()) f.content_world_size = *sizes.begin();
  return f;
}

// Ranks exactly 0..N-1, each once, of one world size; names agree with content.
// With a sink, each violation is reported; a second file claiming a rank and
// a file outside the world size are left out, so the rest still merges.
int check_ranks(std::vector<RankFile>& files, ProblemSink* sink) {
  for (const auto& f : files)
    if (f.content_rank >= 0 && f.content_rank != f.name.rank)
      report_or_fail(sink, {ErrorCode::kDataLoss,
                            f.path + ": holds the shards of rank " + std::to_string(f.content_rank) +
                                " (from its ShardedTensor/DTensor placements), but its name says rank " +
                                std::to_string(f.name.rank) + " (was it copied or renamed?)",
                            f.path, f.name.rank});
  std::stable_sort(files.begin(), files.end(),
                   [](const RankFile& a, const RankFile& b) { return a.name.rank < b.name.rank; });
  for (std::size_t i = 1; i < files.size();) {
    if (files[i].name.rank != files[i - 1].name.rank) {
      ++i;
      continue;
    }
    report_or_fail(sink, {ErrorCode::kDataLoss,
                          "two files claim rank " + std::to_string(files[i].name.rank) + ": " + files[i - 1].path +
                              " and " + files[i].path,
                          files[i].path, files[i].name.rank});
    files.erase(files.begin() + static_cast<std::ptrdiff_t>(i));
  }

  int world_size = -1;
  std::string said_by;
  auto agree = [&](const RankFile& f, int ws, const char* how) {
    if (ws < 0) return;
    std::string who = f.path + " (world size " + std::to_string(ws) + ", from its " + how + ")";
    if (world_size < 0) {
      world_size = ws;
      said_by = who;
    } else if (ws != world_size) {
      report_or_fail(sink, {ErrorCode::kDataLoss, "files from different world sizes: " + said_by + " and " + who,
                            f.path, f.name.rank});
    }
  };
  for (const auto& f : files) {
    agree(f, f.content_world_size, "sharded values' process group");
    agree(f, f.name.world_size, "name");
  }
  if (world_size < 0) world_size = files.back().name.rank + 1;
  while (!files.empty() && files.back().name.rank >= world_size) {
    const RankFile& f = files.back();
    report_or_fail(sink, {ErrorCode::kDataLoss,
                          f.path + ": rank " + std::to_string(f.name.rank) + " is outside world size " +
                              std::to_string(world_size) + " (" + said_by + ")",
                          f.path, f.name.rank});
    files.pop_back();
  }
  if (files.empty()) fail_data_loss("no rank file is inside world size " + std::to_string(world_size));

  std::vector<std::string> missing, found;
  Problem first_missing;
  std::size_t next = 0;
  fs::path dir = fs::path(files.front().path).parent_path();
  for (int r = 0; r < world_size; ++r) {
    if (next < files.size() && files[next].name.rank == r) {
      found.push_back(files[next++].path);
    } else {
      std::string path = (dir / files.front().name.name_for(r)).string();
      if (missing.empty()) first_missing = {ErrorCode::kNotFound, "", path, r};
      missing.push_back(path + " (rank " + std::to_string(r) + ")");
    }
  }
  if (!missing.empty()) {
    first_missing.message = "missing rank file" + std::string(missing.size() > 1 ? "s" : "") + " of world size " +
                            std::to_string(world_size) + ": " + join(missing) + "; found " + join(found);
    report_or_fail(sink, std::move(first_missing));
  }
  return world_size;
}

// What the family tells about the source. The DeviceMesh is looked up only
// when the family holds DTensors (a job writing DTensor files names it).
SourceInfo family_info(const Family& family, int world_size, const CheckpointModel& merged) {
  SourceInfo info;
  info.kind = SourceKind::kFsdpRanks;
  RankFamilyInfo fam{family.kind, family.files.front().first, family.tmpl, {}, world_size};
  for (const auto& [path, name] : family.files) fam.files.push_back(path);
  info.files = fam.files;
  info.families.push_back(std::move(fam));
  info.world_sizes = {world_size};
  bool dtensors = std::any_of(merged.tensors.begin(), merged.tensors.end(),
                              [](const TensorEntry& t) { return t.storage == StorageKind::kDTensor; });
  for (const auto& path : info.files) {
    if (!dtensors) break;
    try {
      if ((info.mesh = torch_pt::find_device_mesh(open_mapped_source(path)))) break;
    } catch (const Error&) {
      // an unreadable file was reported when it was read; try the next
    }
  }
  return info;
}

// Two families read side by side ({"model": ..., "optim": ...}): one source.
void merge_info(SourceInfo& into, const SourceInfo& other) {
  for (const auto& f : other.families) into.families.push_back(f);
  into.files.insert(into.files.end(), other.files.begin(), other.files.end());
  std::sort(into.files.begin(), into.files.end());
  for (int ws : other.world_sizes)
    if (std::find(into.world_sizes.begin(), into.world_sizes.end(), ws) == into.world_sizes.end())
      into.world_sizes.push_back(ws);
  if (!into.mesh) into.mesh = other.mesh;
}

// A family's files, each decoded, their ranks checked.
struct FamilyFiles {
  const Family* family = nullptr;
  std::vector<RankFile> files;
  int world_size = 0;

  const RankFile& base() const {
    auto it = std::find_if(files.begin(), files.end(), [](const RankFile& f) { return !f.unreadable; });
    if (it == files.end())
      fail_data_loss("none of the " + std::to_string(files.size()) + " files of '" + family->tmpl + "' could be read");
    return *it;
  }
};

FamilyFiles read_family_files(const Family& family, ProblemSink* sink) {
  FamilyFiles out{&family, {}, 0};
  for (const auto& [path, name] : family.files) out.files.push_back(read_rank_file(path, name, sink));
  out.world_size = check_ranks(out.files, sink);
  return out;
}

CheckpointModel merge_family(FamilyFiles&& read, ProblemSink* sink) {
  const Family& family = *read.family;
  std::vector<RankFile>& files = read.files;
  const int world_size = read.world_size;
  // The lowest readable rank is the base the others merge into.
  auto base = files.begin() + (&read.base() - files.data());
  CheckpointModel merged = std::move(base->model);
  for (auto it = base + 1; it != files.end(); ++it) {
    if (it->unreadable) continue;
    merge_rank_model(merged, base->path, it->model, it->path, it->name.rank, sink);
    it->model = {};
  }
  std::size_t dropped = drop_replica_chunks(merged);
  // Rank 0 described its own mesh coordinate; the merged tensor has every rank's.
  static const LinearRegex kCoordinate = LinearRegex::compile(R"( at \([0-9, ]*\))");
  for (auto& t : merged.tensors) {
    std::string kept;
    std::string_view rest = t.sharding;
    for (RegexMatch m; kCoordinate.search(rest, m); rest.remove_prefix(m.position(0) + m.length(0)))
      kept.append(rest.substr(0, m.position(0)));
    t.sharding = kept.append(rest);
  }
  merged.facts["world_size"] = std::to_string(world_size);
  merged.facts[family.kind.empty() ? "files" : family.kind + "_files"] =
      std::to_string(files.size()) + " x " + family.tmpl + " in " + fs::path(files.front().path).parent_path().string();
  if (dropped) merged.facts["replica_chunks_dropped"] = std::to_string(dropped);
  merged.info = family_info(family, world_size, merged);
  return merged;
}

std::vector<Family> group_families(const std::vector<std::string>& paths) {
  for (const auto& path : paths) {
    if (stat_path(path).kind == EntryKind::kNone) {  // missing, or a dangling link
      // A quoted pattern given to --files is the user's mistake (exit 2), a
      // listed file that is gone is missing input (exit 3), as for SRC.
      if (path.find_first_of("*?[") != std::string::npos) fail_invalid(path + ": no file matches this pattern");
      fail(ErrorCode::kNotFound, path + ": no such file or directory");
    }
  }
  std::vector<std::string> unnamed;
  std::vector<std::pair<std::string, RankFileName>> named = name_rank_files(paths, &unnamed);
  if (!unnamed.empty())
    fail_invalid(unnamed.front() +
                 ": no rank in its file name (expected *rank{r}*.pt/.bin, *_world_size_{N}_rank_{r}.pt, or files "
                 "whose names differ only in the rank: model_shard_{r}.pt, {r}.pt)");
  // In path order, whichever rule named them.
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Family> families;
  for (const auto& file : named) {
    const RankFileName& name = file.second;
    if (name.auxiliary) {
      log::info("skipping " + file.first + ": not a state dict (veRL extra state)");
      continue;
    }
    auto it = std::find_if(families.begin(), families.end(), [&](const Family& f) { return f.tmpl == name.tmpl; });
    if (it == families.end()) it = families.insert(families.end(), Family{name.tmpl, name.kind, {}});
    it->files.push_back(file);
  }
  return families;
}

std::string family_list(const std::vector<const Family*>& families) {
  std::vector<std::string> out;
  for (const Family* f : families) out.push_back("'" + f->tmpl + "' (" + std::to_string(f->files.size()) + " files)");
  return join(out);
}

// Several families of one kind: two files claiming one rank, or an ambiguity.
// With a sink, each second claim is reported and the family with the most
// files (the first of them on a tie) is read.
const Family* resolve_several(std::vector<const Family*> same_kind, ProblemSink* sink) {
  std::stable_sort(same_kind.begin(), same_kind.end(),
                   [](const Family* a, const Family* b) { return a->files.size() > b->files.size(); });
  std::map<int, std::string> owner;
  bool claimed_twice = false;
  for (const Family* f : same_kind)
    for (const auto& [path, name] : f->files) {
      auto [it, fresh] = owner.emplace(name.rank, path);
      if (fresh) continue;
      claimed_twice = true;
      report_or_fail(sink, {ErrorCode::kDataLoss,
                            "two files claim rank " + std::to_string(name.rank) + ": " + it->second + " and " + path,
                            path, name.rank});
    }
  if (!claimed_twice)
    fail_invalid("several families of per-rank files: " + family_list(same_kind) +
                 "; choose one with a glob or --files");
  return same_kind.front();
}

std::vector<const Family*> choose_families(const std::vector<Family>& families, const std::string& only,
                                           ProblemSink* sink) {
  std::vector<const Family*> all;
  for (const auto& f : families) all.push_back(&f);
  if (all.empty()) fail(ErrorCode::kNotFound, "no per-rank state-dict files");
  std::map<std::string, std::vector<const Family*>> by_kind;
  for (const Family* f : all) by_kind[f->kind].push_back(f);
  for (auto& [kind, list] : by_kind)
    if (list.size() > 1) list = {resolve_several(list, sink)};
  all.clear();
  for (const auto& [kind, list] : by_kind) all.push_back(list.front());
  if (!only.empty()) {
    if (!by_kind.count(only)) fail_invalid("--only " + only + ": no " + only + " files among " + family_list(all));
    return by_kind[only];
  }
  if (all.size() == 1) return all;
  if (all.size() == 2 && by_kind.count("model") && by_kind.count("optim"))
    return {by_kind["model"][0], by_kind["optim"][0]};
  fail_invalid("cannot tell model from optimizer files among " + family_list(all) +
               "; choose one family with a glob or --files");
}

void prefix_names(CheckpointModel& model, const std::string& prefix) {
  for (auto& t : model.tensors) t.name = prefix + "." + t.name;
}

}  // namespace

namespace {

bool holds_flat(const FamilyFiles& f) {
  const CheckpointModel& m = f.base().model;
  return fsdp_flat::holds_flat_params(m) || fsdp_flat::holds_flat_optimizer_state(m);
}

// FSDP1 flat parameters (LOCAL_STATE_DICT model files, raw optim.state_dict()
// files): unflattened with the layout file; without one, refused saying what
// is missing. `chosen` are the families --only picked; the model family is
// read even under --only optim, for its units.
CheckpointModel read_flat(const std::vector<Family>& families, std::vector<FamilyFiles>& chosen,
                          const std::string& only, const std::string& param_layout,
                          const std::function<CheckpointModel()>& param_layout_model, ProblemSink* sink) {
  const FamilyFiles& flat = *std::find_if(chosen.begin(), chosen.end(), holds_flat);
  const bool optim = fsdp_flat::holds_flat_optimizer_state(flat.base().model);
  const std::string units_note =
      " The FSDP units are recorded only in LOCAL_STATE_DICT model files, which unflattening the optimizer files "
      "needs beside them; model files saved otherwise (SHARDED_STATE_DICT) consolidate alone with --only model.";
  if (param_layout.empty()) {
    fail(ErrorCode::kUnimplemented,
         flat.base().path +
             (optim ? ": a raw optimizer.state_dict() of FSDP1 flat parameters (integer ids, each rank's tensors 1-D "
                      "slices of a flat parameter)"
                    : ": a LOCAL_STATE_DICT of FSDP1 flat parameters (each unit's `_flat_param` a 1-D ShardedTensor)") +
             ". Which parameters a flat parameter holds, with what shapes and padding, is not stored in these "
             "files: give the model's parameter names, shapes and order with --param-layout FILE (any checkpoint "
             "of the same model that keeps its state_dict() order: a torch.save'd state_dict() such as the "
             "initialisation or a pretrained .pt/.bin, FSDP full or sharded state dict files, a DCP checkpoint)." +
             (optim ? units_note : ""));
  }
  std::vector<FamilyFiles> all;
  for (const Family* f : choose_families(families, "", sink)) {
    auto it = std::find_if(chosen.begin(), chosen.end(), [&](const FamilyFiles& c) { return c.family == f; });
    all.push_back(it != chosen.end() ? std::move(*it) : read_family_files(*f, sink));
  }
  fsdp_flat::Inputs in;
  in.want_model = only != "optim";
  in.want_optim = only != "model";
  in.world_size = all.front().world_size;
  SourceInfo info;
  for (const FamilyFiles& f : all) {
    if (f.world_size != in.world_size)
      fail_data_loss("the model and optimizer files are of world sizes " + std::to_string(in.world_size) + " and " +
                     std::to_string(f.world_size));
    const bool is_optim = fsdp_flat::holds_flat_optimizer_state(f.base().model);
    if (!is_optim && !fsdp_flat::holds_flat_params(f.base().model))
      fail(ErrorCode::kUnimplemented,
           f.base().path + ": not a LOCAL_STATE_DICT of flat parameters, beside raw optimizer files of them." +
               units_note);
    // validate reads past a missing or unreadable rank; unflattening needs every one.
    if (f.files.size() != std::size_t(f.world_size))
      fail_data_loss(f.family->tmpl + ": " + std::to_string(f.files.size()) + " of " + std::to_string(f.world_size) +
                     " rank files, so the flat parameters cannot be unflattened");
    for (const RankFile& r : f.files) {
      if (r.unreadable) fail_data_loss(r.path + ": unreadable, so its rank's flat parameters cannot be unflattened");
      (is_optim ? in.optim : in.model).push_back({r.path, r.name.rank, &r.model});
    }
    SourceInfo fi = family_info(*f.family, f.world_size, f.base().model);
    if (info.families.empty())
      info = std::move(fi);
    else
      merge_info(info, fi);
  }
  if (!param_layout_model)
    fail(ErrorCode::kInternal, "--param-layout " + param_layout + ": given without a reader of its checkpoint");
  CheckpointModel layout = param_layout_model();
  CheckpointModel model = fsdp_flat::unflatten(in, layout, param_layout);
  info.fsdp1 = std::move(model.info.fsdp1);
  model.info = std::move(info);
  model.facts["world_size"] = std::to_string(in.world_size);
  return model;
}

}  // namespace

CheckpointModel read_fsdp_rank_files(const std::vector<std::string>& files, const std::string& source,
                                     const std::string& only, ProblemSink* sink, const std::string& param_layout,
                                     const std::function<CheckpointModel()>& param_layout_model) {
  std::vector<Family> families = group_families(files);
  std::vector<const Family*> chosen = choose_families(families, only, sink);
  std::vector<FamilyFiles> read;
  for (const Family* f : chosen) read.push_back(read_family_files(*f, sink));
  if (std::any_of(read.begin(), read.end(), holds_flat)) {
    CheckpointModel model = read_flat(families, read, only, param_layout, param_layout_model, sink);
    model.source = source;
    return model;
  }
  if (!param_layout.empty())
    fail_invalid("--param-layout is for FSDP1 flat-parameter files (LOCAL_STATE_DICT, raw optimizer.state_dict()); " +
                 source + " holds none");
  if (read.size() == 1) {
    CheckpointModel model = merge_family(std::move(read[0]), sink);
    model.source = source;
    return model;
  }
  // A model and an optimizer family: {"model": ..., "optim": ...}, as DCP checkpoints hold them.
  CheckpointModel model = merge_family(std::move(read[0]), sink);
  CheckpointModel optim = merge_family(std::move(read[1]), sink);
  prune_unreferenced(optim.root, optim.tensors, model.tensors.size());
  prefix_names(model, "model");
  prefix_names(optim, "optim");
  for (auto& t : optim.tensors) model.tensors.push_back(std::move(t));
  for (auto& [k, v] : optim.facts)
    if (!model.facts.emplace(k, v).second && model.facts[k] != v) model.facts[k] += " (model), " + v + " (optim)";
  merge_info(model.info, optim.info);
  model.root = Value::dict({{Value::str("model"), model.root}, {Value::str("optim"), optim.root}});
  model.source = source;
  return model;
}

CheckpointModel read_fsdp_ranks(const std::string& src, const std::string& only, ProblemSink* sink,
                                const std::string& param_layout,
                                const std::function<CheckpointModel()>& param_layout_model) {
  if (is_directory(src)) {
    std::vector<std::string> files = list_rank_files(src);
    if (files.empty()) fail(ErrorCode::kNotFound, src + ": no per-rank files (*rank{r}*.pt) in this directory");
    return read_fsdp_rank_files(files, src, only, sink, param_layout, param_layout_model);
  }
  // Like a directory, a glob may catch files that name no rank (model_full.pt): they are skipped.
  std::vector<std::string> files, unnamed;
  for (const auto& [path, name] : name_rank_files(expand_glob(src), &unnamed)) files.push_back(path);
  for (const auto& path : unnamed) log::info("skipping " + path + ": no rank in its file name");
  std::sort(files.begin(), files.end());
  if (files.empty()) fail(ErrorCode::kNotFound, src + ": matches no per-rank files (*rank{r}*.pt)");
  return read_fsdp_rank_files(files, src, only, sink, param_layout, param_layout_model);
}

}  // namespace ckpt::fsdp_ranks
