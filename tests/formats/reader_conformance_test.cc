// The reader conformance suite: every reader, on a real-torch fixture of its
// family, is held to the same contract.
//
//   info       the SourceInfo says the kind, the world size and files that exist
//   coverage   every tensor's chunks lie inside their storage and cover it exactly
//   content    tensors (names, dtypes, shapes, every byte) and values equal the
//              reference torch wrote beside the fixture (dcp_to_torch_save, or
//              FSDP's FULL_STATE_DICT files), compared with diff at zero tolerance
//   bad input  each file of the fixture cut in half makes reading fail with a
//              ckpt::Error (exit 3) whose message names that file; never a crash
//
// safetensors and HDF5 have no real-torch fixtures in testdata/: they are
// written here from the DCP reference by our writers (the pytest suite reads
// those writers' output with the real safetensors and h5py libraries).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "diff/checkpoint_diff.h"
#include "exec/write_output.h"
#include "formats/detect.h"
#include "formats/source_traits.h"
#include "model/tree_walk.h"
#include "model/validate.h"
#include "plan/select.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

struct Case {
  std::string name;
  std::string source;     // what the reader reads
  std::string only;       // ReadOptions.only
  std::string reference;  // a full state dict torch wrote, read by the torch_pt reader
  SourceKind kind;
  int world_size;
  std::string tag = {};           // ReadOptions.tag: a checkpoint in a folder of them
  std::string param_layout = {};  // ReadOptions.param_layout: FSDP1 flat parameters' names and shapes

  ReadOptions read_options() const {
    ReadOptions r{{}, only, nullptr, tag};
    r.param_layout = param_layout;
    return r;
  }
};

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckptconv-conformance-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Our writers' output of the DCP reference, for the readers without a torch fixture.
std::string written(OutputFormat format, const std::string& file, uint64_t max_shard_size = 0) {
  fs::path out = scratch("written-" + file) / file;
  OutputOptions options;
  options.path = out.string();
  options.durable = false;
  options.max_shard_size = max_shard_size;
  write_output(read_checkpoint(testdata("dcp/fsdp2_adamw_ws2.ref.pt")), format, options);
  return out.string();
}

std::vector<Case> cases() {
  std::vector<Case> out = {
      {"torch.save file", testdata("pt/dtypes.pt"), "", testdata("pt/dtypes.pt"), SourceKind::kTorchPt, 1},
      {"DCP directory", testdata("dcp/fsdp2_adamw_ws3"), "", testdata("dcp/fsdp2_adamw_ws3.ref.pt"),
       SourceKind::kDcpDir, 3},
      {"DCP, per-rank metadata", testdata("dcp/fsdp2_adamw_ws3_rankmeta"), "",
       testdata("dcp/fsdp2_adamw_ws3_rankmeta.ref.pt"), SourceKind::kDcpDir, 3},
      {"DCP, zstd items", testdata("dcp/zstd_ws1"), "", testdata("dcp/zstd_ws1.ref.pt"), SourceKind::kDcpDir, 1},
      {"ShardedTensor rank files (model)", testdata("fsdp_st/adamw_ws3"), "model",
       testdata("fsdp_st/adamw_ws3/model_full.pt"), SourceKind::kFsdpRanks, 3},
      {"ShardedTensor rank files (optim)", testdata("fsdp_st/adamw_ws2"), "optim",
       testdata("fsdp_st/adamw_ws2/optim_full.pt"), SourceKind::kFsdpRanks, 2},
      {"DTensor rank files (model)", testdata("fsdp_dt/adamw_ws3"), "model",
       testdata("fsdp_dt/adamw_ws3/model_full.pt"), SourceKind::kFsdpRanks, 3},
      {"DTensor rank files (optim)", testdata("fsdp_dt/adamw_ws2"), "optim",
       testdata("fsdp_dt/adamw_ws2/optim_full.pt"), SourceKind::kFsdpRanks, 2},
      {"safetensors file", written(OutputFormat::kSafetensors, "ref.safetensors"), "",
       testdata("dcp/fsdp2_adamw_ws2.ref.pt"), SourceKind::kSafetensors, 1},
      {"sharded safetensors (index)", written(OutputFormat::kSafetensors, "sharded.safetensors", 400) + ".index.json",
       "", testdata("dcp/fsdp2_adamw_ws2.ref.pt"), SourceKind::kSafetensorsIndex, 1},
      // Hugging Face folders huggingface_hub wrote, against the state dict torch saved.
      {"Hugging Face folder (sharded, index)", testdata("hf/sharded"), "", testdata("hf/reference.pt"),
       SourceKind::kHfFolder, 1},
      {"Hugging Face folder (shards, no index)", testdata("hf/shards_no_index"), "", testdata("hf/reference.pt"),
       SourceKind::kHfFolder, 1},
      // transformers' save_pretrained of tied embeddings (lm_head.weight not stored), and the same weights as
      // pytorch_model.bin shards with their index, against torch.save(model.state_dict()).
      {"Hugging Face folder (tied embeddings)", testdata("hf/llama_tied"), "", testdata("hf/llama_tied.ref.pt"),
       SourceKind::kHfFolder, 1},
      {"Hugging Face folder (pytorch_model.bin, index)", testdata("hf/llama_tied_bin"), "",
       testdata("hf/llama_tied.ref.pt"), SourceKind::kHfBinFolder, 1},
      // torch's DCP Hugging Face layout, against the job's own full state dict.
      {"DCP Hugging Face layout", testdata("dcp_hf/fsdp2_ws3"), "", testdata("dcp_hf/fsdp2_ws3.ref.pt"),
       SourceKind::kDcpHf, 3},
      // DeepSpeed's own zero_to_fp32 output is the reference (model only).
      {"DeepSpeed ZeRO-2 (model)", testdata("zero/z2_bf16_ws2"), "model",
       testdata("zero/z2_bf16_ws2/reference_fp32.pt"), SourceKind::kZero, 2},
      {"DeepSpeed ZeRO-3 fp16 (model)", testdata("zero/z3_fp16_ws3"), "model",
       testdata("zero/z3_fp16_ws3/reference_fp32.pt"), SourceKind::kZero, 3},
      // ds_to_universal.py's output of the ZeRO fixtures, against zero_to_fp32's.
      {"DeepSpeed universal, ZeRO-2 (model)", testdata("ucp/z2_bf16_ws2"), "model",
       testdata("zero/z2_bf16_ws2/reference_fp32.pt"), SourceKind::kDsUniversal, 2},
      {"DeepSpeed universal, ZeRO-3 (model)", testdata("ucp/z3_bf16_ws2/global_step3_universal"), "model",
       testdata("zero/z3_bf16_ws2/reference_fp32.pt"), SourceKind::kDsUniversal, 2},
      // Accelerate's model and optimizer DCP directories, against FSDP's own
      // FULL_STATE_DICT of the same step; and the same, chosen by --tag in
      // the folder of checkpoints.
      {"DCP pair (Accelerate, model)", testdata("frameworks/accelerate_fsdp1_ws2/project/checkpoints/checkpoint_1"),
       "model", testdata("frameworks/accelerate_fsdp1_ws2/references/checkpoint_1/model_full.pt"), SourceKind::kDcpPair,
       2},
      {"folder of checkpoints, --tag latest", testdata("frameworks/accelerate_fsdp1_ws2/project/checkpoints"), "model",
       testdata("frameworks/accelerate_fsdp1_ws2/references/checkpoint_1/model_full.pt"), SourceKind::kDcpPair, 2,
       "latest"},
      // FSDP1's LOCAL_STATE_DICT and raw optimizer files, against FULL_STATE_DICT and FSDP.optim_state_dict.
      {"FSDP1 flat parameters (model)", testdata("fsdp1/torch2.15/orig_adamw_ws3"), "model",
       testdata("fsdp1/torch2.15/orig_adamw_ws3/model_full.pt"), SourceKind::kFsdpRanks, 3, "",
       testdata("fsdp1/torch2.15/orig_adamw_ws3/layout.pt")},
      {"FSDP1 flat parameters (optim)", testdata("fsdp1/torch2.4/flat_sgd_ws4"), "optim",
       testdata("fsdp1/torch2.4/flat_sgd_ws4/optim_full.pt"), SourceKind::kFsdpRanks, 4, "",
       testdata("fsdp1/torch2.4/flat_sgd_ws4/layout.pt")},
      // megatron-core's torch_dist, against its own dist_checkpointing.load into a TP=1/PP=1 model.
      {"Megatron torch_dist TP=2 x PP=2 (model)", testdata("megatron/gpt_tp2pp2/ckpt"), "model",
       testdata("megatron/gpt_tp2pp2/model_ref.pt"), SourceKind::kMegatron, 4},
  };
#ifdef CKPT_HAVE_HDF5
  out.push_back({"HDF5 file", written(OutputFormat::kHdf5, "ref.h5"), "", testdata("dcp/fsdp2_adamw_ws2.ref.pt"),
                 SourceKind::kHdf5, 1});
#endif
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A copy of the case's files with `victim` cut in half; the path to read.
// A directory is copied whole; a file with the files beside it it names
// (an index and its shards).
std::string with_truncated(const Case& c, const std::vector<std::string>& files, const std::string& victim) {
  fs::path dir = scratch("truncated");
  fs::path src = c.source;
  fs::path copy = dir / src.filename();
  fs::path home = fs::is_directory(src) ? src : src.parent_path();
  if (fs::is_directory(src)) {
    fs::copy(src, copy, fs::copy_options::recursive);
  } else {
    fs::copy_file(src, copy);
    for (const auto& f : files)
      if (!fs::exists(dir / fs::relative(f, home))) fs::copy_file(f, dir / fs::relative(f, home));
  }
  fs::path cut = (fs::is_directory(src) ? copy : dir) / fs::relative(victim, home);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  return copy.string();
}

}  // namespace

TEST_CASE("every reader meets the same contract on a real fixture", "[formats][conformance]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    CheckpointModel model = read_checkpoint(c.source, c.read_options());
    // --only, where the reader leaves it to selection (as jobs do)
    if (!c.only.empty() && !source_traits(model.info.kind).reader_selects_only) {
      SelectOptions only;
      only.only = c.only;
      model = select_entries(model, only);
    }

    // info
    CHECK(model.info.kind == c.kind);
    CHECK(model.info.world_sizes == std::vector<int>{c.world_size});
    REQUIRE_FALSE(model.info.files.empty());
    for (const auto& f : model.info.files) CHECK(fs::is_regular_file(f));

    // coverage
    CHECK_NOTHROW(require_valid(model));
    REQUIRE_FALSE(model.tensors.empty());

    // content
    CheckpointModel reference = read_checkpoint(c.reference);
    DiffReport diff = diff_models(model, reference, {});
    std::size_t tensor_leaves = 0;  // a tied weight is two leaves of one tensor
    walk_leaves(*reference.root, [&](const Leaf& leaf) { tensor_leaves += leaf.tensor ? 1 : 0; });
    CHECK(diff.tensors.size() == tensor_leaves);
    CHECK(diff.equal());

    // bad input: each file cut in half (single files: the file itself)
    std::vector<std::string> victims = model.info.files;
    if (victims.size() > 3) victims.resize(3);
    for (const auto& victim : victims) {
      INFO("truncated: " << victim);
      std::string path = with_truncated(c, model.info.files, victim);
      try {
        CheckpointModel bad = read_checkpoint(path, c.read_options());
        require_valid(bad);
        FAIL("reading a truncated file succeeded");
      } catch (const Error& e) {
        CHECK(exit_code_for(e.code()) == 3);
        CHECK(contains(e.what(), fs::path(victim).filename().string()));
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
    if (entry.path().filename().string().rfind("ckptconv-conformance-", 0) == 0) fs::remove_all(entry.path());
}
