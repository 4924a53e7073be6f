#include "formats/zero/zero_listing.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/linear_regex.h"
#include "core/log.h"
#include "core/paths.h"
#include "formats/latest_file.h"
#include "io/containment.h"
#include "io/storage.h"

namespace ckpt::zero {

namespace fs = std::filesystem;

namespace {

// The rank files of one model-parallel rank (`mp_rank_XX`), as named.
struct MpRankNames {
  std::map<int, std::string> optim, rank_model;  // by data-parallel rank
  std::string single_model;                      // mp_rank_XX_model_states.pt
};

// The ZeRO files of model-parallel rank `mp` (two digits, as DeepSpeed
// writes it) in `dir`: its optimizer files by data-parallel rank, each once,
// and its model states (ZeRO-3: one per rank).
TagFiles mp_rank_files(const std::string& dir, const std::string& mp, const MpRankNames& names) {
  TagFiles out;
  out.dir = dir;
  // Without ZeRO (stage 0) the optimizer state is in the model-states file
  // (stage0.h): the reader says whether it is there; list_files whether
  // another mp rank's optimizer files say this one's are missing.
  if (names.optim.empty() && names.rank_model.empty() && !names.single_model.empty()) {
    out.model.push_back({0, names.single_model});
    return out;
  }
  if (names.optim.empty())
    fail(ErrorCode::kNotFound,
         dir + ": no *_mp_rank_" + mp + "_optim_states.pt files (a ZeRO checkpoint has one per rank)");
  int ws = names.optim.rbegin()->first + 1;
  for (int r = 0; r < ws; ++r) {
    auto it = names.optim.find(r);
    if (it == names.optim.end())
      fail(ErrorCode::kNotFound, dir + ": the optimizer file of rank " + std::to_string(r) + " of " +
                                     std::to_string(ws) + " is missing (*zero_pp_rank_" + std::to_string(r) +
                                     "_mp_rank_" + mp + "_optim_states.pt)");
    out.optim.push_back({r, it->second});
  }
  if (!names.rank_model.empty()) {
    out.per_rank_model = true;
    for (int r = 0; r < ws; ++r) {
      auto it = names.rank_model.find(r);
      if (it == names.rank_model.end())
        fail(ErrorCode::kNotFound, dir + ": the model-states file of rank " + std::to_string(r) +
                                       " is missing (zero_pp_rank_" + std::to_string(r) + "_mp_rank_" + mp +
                                       "_model_states.pt)");
      out.model.push_back({r, it->second});
    }
    if (names.rank_model.rbegin()->first >= ws)
      fail_data_loss(dir + ": model-states files for " + std::to_string(names.rank_model.rbegin()->first + 1) +
                     " ranks but optimizer files for " + std::to_string(ws) + " (files of two world sizes mixed)");
  } else if (!names.single_model.empty()) {
    out.model.push_back({0, names.single_model});
  } else {
    fail(ErrorCode::kNotFound, dir + ": no mp_rank_" + mp + "_model_states.pt (ZeRO-1/2) or zero_pp_rank_0_mp_rank_" +
                                   mp + "_model_states.pt (ZeRO-3)");
  }
  return out;
}

}  // namespace

bool has_model_states(const std::string& dir) {
  for (const DirEntry& e : list_directory(dir)) {
    const std::string& name = e.name;
    static const std::string kSuffix = "_model_states.pt";
    if (name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
      return true;
  }
  return false;
}

std::string tag_dir(const std::string& src, const std::string& tag) {
  fs::path root(src);
  if (!tag.empty()) {
    if (tag.find('/') != std::string::npos || tag == ".." || tag == ".")
      fail_invalid("--tag '" + tag + "' must name a directory inside " + src);
    fs::path dir = root / tag;
    if (!is_directory(dir.string())) fail(ErrorCode::kNotFound, src + ": no tag directory '" + tag + "'");
    require_inside(dir.string(), src);
    return dir.string();
  }
  if (has_model_states(root)) return root.string();
  std::optional<std::string> named = read_latest_tag(root / "latest");
  if (!named) fail(ErrorCode::kNotFound, src + ": no `latest` file and no --tag: give --tag NAME");
  const std::string& latest = *named;
  fs::path dir = root / latest;
  if (!is_directory(dir.string()))
    fail(ErrorCode::kNotFound, src + ": `latest` names tag '" + latest + "', which is not a directory here");
  require_inside(dir.string(), src);
  return dir.string();
}

TagListing list_files(const std::string& dir) {
  static const LinearRegex optim_re =
      LinearRegex::compile(R"(^(bf16_)?zero_pp_rank_(\d{1,6})_mp_rank_(\d{1,6})_optim_states\.pt$)");
  static const LinearRegex rank_model_re =
      LinearRegex::compile(R"(^zero_pp_rank_(\d{1,6})_mp_rank_(\d{1,6})_model_states\.pt$)");
  static const LinearRegex model_re = LinearRegex::compile(R"(^mp_rank_(\d{1,6})_model_states\.pt$)");
  // PipelineModule.ckpt_layer_path: `layer_{idx:02d}`, then `-model_{TT:02d}`
  // when the topology has a tensor axis (get_rank_repr), then `-model_states.pt`.
  static const LinearRegex layer_re = LinearRegex::compile(R"(^layer_(\d{2,6})-model_states\.pt$)");
  static const LinearRegex tp_layer_re = LinearRegex::compile(R"(^layer_(\d{2,6})-model_(\d{2,6})-model_states\.pt$)");
  // MoE (engine._get_expert_ckpt_name, _get_optimizer_ckpt_name)
  static const LinearRegex expert_re =
      LinearRegex::compile(R"(^layer_(\d{1,6})_expert_(\d{1,6})_mp_rank_(\d{2,6})_model_states\.pt$)");
  static const LinearRegex old_expert_re = LinearRegex::compile(R"(^expert_\d{1,6}_mp_rank_\d{2,6}_model_states\.pt$)");
  static const LinearRegex expp_re = LinearRegex::compile(R"(^expp_rank_\d{1,6}_mp_rank_\d{2,6}_optim_states\.pt$)");
  std::map<std::string, MpRankNames> by_mp;
  TagListing out;
  out.dir = dir;
  std::string moe_file;
  if (!is_directory(dir)) fail(ErrorCode::kNotFound, dir + ": cannot list directory: not a directory");
  for (const DirEntry& e : list_directory(dir)) {
    const std::string& name = e.name;
    RegexMatch m;
    if (optim_re.match(name, m)) {
      by_mp[m.str(3)].optim[std::stoi(m.str(2))] = e.path;
    } else if (rank_model_re.match(name, m)) {
      by_mp[m.str(2)].rank_model[std::stoi(m.str(1))] = e.path;
    } else if (model_re.match(name, m)) {
      by_mp[m.str(1)].single_model = e.path;
    } else if (layer_re.match(name, m)) {
      out.layer_files[std::stoi(m.str(1))] = e.path;
    } else if (tp_layer_re.match(name, m)) {
      out.tp_layer_files[std::stoi(m.str(2))][std::stoi(m.str(1))] = e.path;
    } else if (expert_re.match(name, m) && m[3] == "00") {
      out.expert_files[{std::stoi(m.str(1)), std::stoi(m.str(2))}] = e.path;
    } else if (expert_re.match(name, m) || old_expert_re.match(name, m) || expp_re.match(name, m)) {
      moe_file = name;
    } else {
      log::debug("ignoring " + e.path + ": not a ZeRO model or optimizer states file");
      continue;
    }
    require_inside(e.path, dir);
  }
  std::string found;
  for (const auto& [mp, names] : by_mp) found += (found.empty() ? "mp_rank_" : ", mp_rank_") + mp;
  if (!moe_file.empty())
    fail(ErrorCode::kUnimplemented,
         dir + ": " + moe_file +
             ": a MoE file of a layout ckptconv does not read (expert files of tensor-parallel ranks, "
             "pre-0.5 expert_E files, or the expp_rank optimizer files of a run without ZeRO); it reads "
             "layer_L_expert_E_mp_rank_00 files beside ZeRO-1/2 optimizer files");
  if (!out.expert_files.empty() && (!out.layer_files.empty() || !out.tp_layer_files.empty()))
    fail(ErrorCode::kUnimplemented, dir + ": MoE expert files beside pipeline layer files are not supported");
  if (!out.layer_files.empty() && !out.tp_layer_files.empty())
    fail_data_loss(dir + ": layer files with a tensor-parallel rank (" +
                   file_name(out.tp_layer_files.begin()->second.begin()->second) + ") beside layer files without (" +
                   file_name(out.layer_files.begin()->second) + "): files of two runs mixed");
  if (!out.expert_files.empty() && (by_mp.size() > 1 || (by_mp.size() == 1 && by_mp.begin()->first != "00")))
    fail(ErrorCode::kUnimplemented,
         dir + ": MoE expert files beside tensor-parallel ranks (" + found + ") are not supported");
  if (by_mp.empty())
    fail(ErrorCode::kNotFound, dir + ": no *_optim_states.pt files (a ZeRO checkpoint has one per rank)");
  // Pipeline stages (PipelineParallelGrid's ds_model_rank), or without layer
  // files the tensor-parallel ranks of an mpu, are the mp ranks 00..S-1, each
  // written in two digits; every one must be there.
  int stages = 0;
  for (const auto& [mp, names] : by_mp) stages = std::max(stages, std::stoi(mp) + 1);
  std::string with_optim, without_optim;  // the first mp rank with optimizer files, the first without
  for (int s = 0; s < stages; ++s) {
    std::string mp(s < 10 ? "0" : "");
    mp += std::to_string(s);
    auto it = by_mp.find(mp);
    if (it == by_mp.end())
      fail(ErrorCode::kNotFound, dir + ": the files of " +
                                     (!out.tp_layer_files.empty() ? "model-parallel rank (stage x tp + tp rank) "
                                      : out.layer_files.empty()   ? "tensor-parallel rank "
                                                                  : "pipeline stage ") +
                                     std::to_string(s) + " of " + std::to_string(stages) + " are missing (mp_rank_" +
                                     mp + "_model_states.pt)");
    out.mp_ranks.push_back(mp_rank_files(dir, mp, it->second));
    std::string& first = out.mp_ranks.back().optim.empty() ? without_optim : with_optim;
    if (first.empty()) first = mp;
  }
  // Without ZeRO no mp rank has optimizer files; beside one that has them,
  // a rank without is a ZeRO save whose files of that rank are missing.
  if (!with_optim.empty() && !without_optim.empty())
    fail(ErrorCode::kNotFound, dir + ": no *_mp_rank_" + without_optim + "_optim_states.pt files, where mp_rank_" +
                                   with_optim + " has them (a ZeRO checkpoint has one per rank)");
  if (by_mp.size() != std::size_t(stages))
    fail_data_loss(dir + ": model-parallel ranks " + found + " are not numbered mp_rank_00.." +
                   std::to_string(stages - 1) + " in two digits");
  return out;
}

bool is_zero_checkpoint(const std::string& dir) {
  fs::path root(dir);
  if (has_model_states(root)) return true;
  std::optional<std::string> tag;
  try {
    tag = read_latest_tag(root / "latest");
  } catch (const Error&) {
    return false;  // a `latest` that names no tag: the folder's listing says so
  }
  return tag && is_directory((root / *tag).string()) && has_model_states(root / *tag);
}

bool is_deepspeed_root(const std::string& dir) {
  if (has_model_states(fs::path(dir))) return false;
  for (const DirEntry& sub : list_directory(dir))
    if (sub.is_directory() && has_model_states(sub.path)) return true;
  return false;
}

bool holds_zero_files(const std::string& dir) {
  for (const DirEntry& e : list_directory(dir)) {
    const std::string& name = e.name;
    if (name.ends_with("_optim_states.pt") || name.ends_with("_model_states.pt")) return true;
  }
  return false;
}

std::optional<int> tag_world_size(const std::string& dir) {
  static const LinearRegex optim_re =
      LinearRegex::compile(R"(^(bf16_)?zero_pp_rank_(\d{1,6})_mp_rank_(\d{1,6})_optim_states\.pt$)");
  static const LinearRegex rank_model_re =
      LinearRegex::compile(R"(^zero_pp_rank_(\d{1,6})_mp_rank_(\d{1,6})_model_states\.pt$)");
  static const LinearRegex model_re = LinearRegex::compile(R"(^mp_rank_(\d{1,6})_model_states\.pt$)");
  // per model-parallel rank (pipeline stage): its data-parallel ranks' files
  std::map<int, std::set<int>> optim, rank_model;
  std::set<int> single_model;
  for (const DirEntry& e : list_directory(dir)) {
    const std::string& name = e.name;
    RegexMatch m;
    if (optim_re.match(name, m))
      optim[std::stoi(m.str(3))].insert(std::stoi(m.str(2)));
    else if (rank_model_re.match(name, m))
      rank_model[std::stoi(m.str(2))].insert(std::stoi(m.str(1)));
    else if (model_re.match(name, m))
      single_model.insert(std::stoi(m.str(1)));
  }
  const int stages = static_cast<int>(optim.size());
  // A tag without ZeRO (stage0.h: mp_rank_00_model_states.pt alone) has the
  // names of a ZeRO save that died before its optimizer files: nullopt here,
  // stage0_world_size reads which it is.
  if (stages == 0 || optim.rbegin()->first != stages - 1) return std::nullopt;
  const int n = static_cast<int>(optim.begin()->second.size());
  for (const auto& [mp, ranks] : optim) {
    if (int(ranks.size()) != n || *ranks.rbegin() != n - 1) return std::nullopt;
    auto per_rank = rank_model.find(mp);
    if (per_rank != rank_model.end() ? per_rank->second != ranks : !single_model.count(mp))
      return std::nullopt;  // ZeRO-3: one model-states file per rank; else one per stage
  }
  return n * stages;
}

}  // namespace ckpt::zero
