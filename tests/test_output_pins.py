"""Output bytes pinned: consolidate, convert and reshard of the testdata
fixtures give these exact SHA-256s. They were recorded with the binary built
before the jobs layer (commit 3392e73) and checked equal after it; a change
here is a change of output bytes and must be deliberate (regenerating
testdata changes them too: rerun the commands of COMMANDS and update PINS).
DCP `.metadata` is not pinned: it holds a random save id, as torch's does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

TD = Path(__file__).resolve().parent.parent / "testdata"

COMMANDS = [
    ["consolidate", "dcp/fsdp2_adamw_ws3", "-o", "c_dcp.pt"],
    ["consolidate", "dcp/fsdp2_adamw_ws3", "-o", "c_dcp.safetensors"],
    ["consolidate", "fsdp_st/adamw_ws3", "-o", "c_st.pt"],
    # model and optimizer state cast (--dtype alone keeps the optimizer's dtypes)
    ["consolidate", "fsdp_dt/adamw_ws2", "-o", "c_dt_bf16.pt", "--dtype", "bf16", "--optim-dtype", "bf16"],
    ["consolidate", "fsdp_st/adamw_ws2", "--only", "optim", "-o", "c_st_optim.pt"],
    ["convert", "pt/dtypes.pt", "-o", "conv.pt"],
    ["reshard", "dcp/fsdp2_adamw_ws3", "-o", "r_dcp_5", "--world-size", "5"],
    ["reshard", "fsdp_st/adamw_ws3", "-o", "r_st_2", "--world-size", "2"],
    ["reshard", "fsdp_dt/adamw_ws2", "-o", "r_dt_3", "--world-size", "3"],
    ["reshard", "dcp/fsdp2_adamw_ws2", "-o", "r_dcp_dt_4", "--world-size", "4", "--layout", "fsdp-dtensor"],
    ["reshard", "dcp/fsdp2_adamw_ws2.ref.pt", "-o", "r_full_st_3", "--world-size", "3", "--layout", "fsdp-sharded-tensor"],
]

PINS = {
    "c_dcp.pt": "6abd739a7b25da0067da285c92f774f85854a076b13150793ebb7b90375497cc",
    "c_dcp.safetensors": "6764049924d878e0b528d4ae58ec7580f90daf2ffa8312226ea6a9dfa0941a24",
    "c_dt_bf16.pt": "8e395c4d438928258999f747b7dd62b2fe4017f2b3990976fde46c863a4b6a40",
    "c_st.pt": "1437f2cfb452463204d2e9358af49c9e2261f104fef758fe4f34404e6738a71d",
    "c_st_optim.pt": "a1908559aa4083858c28db47ad65494a54c582fce0f35f52c4d3b4c53d0977cb",
    "conv.pt": "4a50187493bd54876c2802f8e66729b45880938f643936df349dfd0ad96e5159",
    "r_dcp_5/__0_0.distcp": "addc9f2fde32996401e7cba93e8cb943e419d2366e3cd1380d6fb159ab0c5e69",
    "r_dcp_5/__1_0.distcp": "68907ab25194bc5b63313c47108d52459f5aec4525a6a8f32fe796798b694e4f",
    "r_dcp_5/__2_0.distcp": "ff66fcf60423396dd776bb4a66e228f5e85292270b4e79418486b4d504467f3c",
    "r_dcp_5/__3_0.distcp": "72cbb148565ab7d380610fd4ce3578453e006bc4634393d5d88e5d7ccba12996",
    "r_dcp_5/__4_0.distcp": "267d0e648875abd2f66dbf3bdf8801382e51c4f018478e5e611a4e3a97b3bd53",
    "r_dcp_dt_4/model_world_size_4_rank_0.pt": "218517a46c2a794cefea9305b9f90bba48b75ac61695b21999d33ca2229405e8",
    "r_dcp_dt_4/model_world_size_4_rank_1.pt": "9035d0464339cde62c5208f9c07e692d7159f1ae821150ae62f9e3d85e03a66c",
    "r_dcp_dt_4/model_world_size_4_rank_2.pt": "3fc62c4540a8f46bcf87fb5495b83ec83ef0cf6f871fe6671a0f9ab7785fc09a",
    "r_dcp_dt_4/model_world_size_4_rank_3.pt": "b506f273f09a10a7c6edd8ca4d9d3cd992d2dd1d791eb168e68a255f398310ac",
    "r_dcp_dt_4/optim_world_size_4_rank_0.pt": "49672425eb739e654d0e114b7df96df87fd035b86f9b00c894c581e86f0443ff",
    "r_dcp_dt_4/optim_world_size_4_rank_1.pt": "6b06d13198a48ae5a2fce8a64c3c1151e1670acbcc411b0c815173dce5473ce3",
    "r_dcp_dt_4/optim_world_size_4_rank_2.pt": "408d03dd9ccd6fd651dd08972378d63b3a5759295fa68d7dc70746368b39c25c",
    "r_dcp_dt_4/optim_world_size_4_rank_3.pt": "bda6c5835924b0630436bd104d592d95aa326626f583b558f7aee5d19f60dee2",
    "r_dt_3/model_world_size_3_rank_0.pt": "78c66c30982ea13f77410822b4c22fbeb4e44fb92b4d947b523bee24dd43d723",
    "r_dt_3/model_world_size_3_rank_1.pt": "953120ee91dc96103a74273c2dae47a6d778c02f414079824b8703d805a85df7",
    "r_dt_3/model_world_size_3_rank_2.pt": "eb64a7d85bfc0d4aafc81730bd30f209cb848b88935e7711e6e74774565670cb",
    "r_dt_3/optim_world_size_3_rank_0.pt": "2d0872444970dd19453580d3e29a3d032f6a192db389889bf492dc00ec632aa8",
    "r_dt_3/optim_world_size_3_rank_1.pt": "5aef99ae5c11a83c0b537223b97444e055fa2fe5f8381dbcd53f0d934bff3950",
    "r_dt_3/optim_world_size_3_rank_2.pt": "cb773821e3aa2671f021ea017ac6a14437b178c9475a09b80b626bcf633ef92f",
    "r_full_st_3/model_rank0.pt": "d6d7beef428c7ef39e33928d49e2fd789b627400c7141278bd8eca26a1354b19",
    "r_full_st_3/model_rank1.pt": "7b52ab910c5d6f9bee26ddd03c8d791e07e6c2dfd7e9480259f8559bb81cfdac",
    "r_full_st_3/model_rank2.pt": "566147bba359fa27d89b803389c104e047ddffb0a34f9032934b66ffb11b3e8a",
    "r_full_st_3/optim_rank0.pt": "041f07b612abdb303012a7da7abb33198ee2e64f3c342cb25b3bbc367826c706",
    "r_full_st_3/optim_rank1.pt": "d012a9de18d93a5eed717998bf2c40855ee8dce8d3942894c9520b8609964d07",
    "r_full_st_3/optim_rank2.pt": "176f73b470edfa0100b8c426ec80e0fdd888529abb4fa3aeb021eefdbf678702",
    "r_st_2/model_rank0.pt": "f869ec2ffc4df8f30ca2685677a79cb92b1f18f46ac64b9c51a76f39202fe86d",
    "r_st_2/model_rank1.pt": "bee1d612045714cdbcfc26007d1db12dfb19a2f4ca026586c6eb4643634a8868",
    "r_st_2/optim_rank0.pt": "3beb119266fa889f9a69cc5b8ca04be85609e08b5eb9bbb19790a9987967caed",
    "r_st_2/optim_rank1.pt": "c6ed768478f3f169d448a224664a0d58f7be58bf280f807e3ed8233ab17bc48e",
}


def test_output_bytes_are_pinned(tmp_path, run_ckptconv):
    for cmd in COMMANDS:
        args = [cmd[0], TD / cmd[1], *[tmp_path / a if prev == "-o" else a for prev, a in zip(cmd[1:], cmd[2:])], "-q"]
        r = run_ckptconv(*args)
        assert r.returncode == 0, f"{cmd}: {r.stderr}"
    got = {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(tmp_path.rglob("*")) if p.is_file() and p.name != ".metadata"}
    assert got == PINS
