"""megatron-core's reading of the way back (run by tests/test_arch_maps_back.py
in the side environment .venv-megatron, which scripts/test makes):

    .venv-megatron/bin/python tests/megatron_arch_back.py ORIGINAL OURS CASE TP PP EP OUT.json

CASE is a folder of testdata/arch/ (tools/make_arch_checkpoints.py: its
model and case.json). Every rank builds that GPT at TP x PP (x EP, the
expert parallelism of an MoE case: each rank loads its experts, at their
global indices) and runs
``dist_checkpointing.load`` of its model's sharded state dict from ORIGINAL
(what megatron-core saved) and from OURS (what ckptconv wrote from a Hugging
Face folder): every loaded tensor must be bit-equal, except the padded
vocabulary rows (rows >= vocab_size of the embedding and the output layer),
which must be zeros in OURS (megatron's own are its random init, which no
Hugging Face folder holds). At PP=1 the model then loads OURS and runs its
forward on the case's token ids in fp32 (the logits gathered over TP): the
largest difference from the committed logits.json goes to OUT.json with
{"ranks", "tensors", "differ", "padded_nonzero", "max_abs_diff"}."""
import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_arch_checkpoints as arch  # noqa: E402
from make_megatron_checkpoints import _init, free_port  # noqa: E402

PADDED = ("embedding.word_embeddings.weight", "output_layer.weight")


def job(rank, ws, port, tp, pp, ep, original, ours, case_dir, out):
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    CudaRNGStatesTracker.fork = lambda self, *a, **k: contextlib.nullcontext()  # no CUDA RNG on the CPU
    # megatron-core 0.16.1's MoE router tests te_general_gemm, undefined
    # without Transformer Engine, for None (as tools/make_arch_checkpoints.py).
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    case = json.loads((Path(case_dir) / "case.json").read_text())
    _, _, extra, spec_opts, _, _ = arch.CASES[Path(case_dir).name]
    if "expert_model_parallel_size" in extra:
        extra = {**extra, "expert_model_parallel_size": ep}
    elif ep != 1:
        sys.exit(f"{case_dir}: a dense model has no expert parallelism")
    model = arch.build(tp, pp, extra, spec_opts, case["padded_vocab_size"])
    vocab = case["vocab_size"]

    def load(path):
        return dist_checkpointing.load({"model": model.sharded_state_dict()}, path)["model"]

    a, b = load(original), load(ours)
    differ, padded_nonzero = [], []
    for k, x in a.items():
        y = b.get(k)
        if not isinstance(x, torch.Tensor):
            if x != y:
                differ.append(k)
            continue
        if not isinstance(y, torch.Tensor) or x.dtype != y.dtype or x.shape != y.shape:
            differ.append(k)
            continue
        if k in PADDED:
            # This rank's rows of the padded vocabulary (TP splits dim 0).
            start = ps.get_tensor_model_parallel_rank() * x.shape[0]
            real = max(0, min(x.shape[0], vocab - start))
            if y[real:].count_nonzero().item():
                padded_nonzero.append(k)
            x, y = x[:real], y[:real]
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            differ.append(k)
    differ += sorted(set(b) - set(a))
    max_abs_diff = None
    if pp == 1:
        model.load_state_dict(b)
        model.eval()
        ref = json.loads((Path(case_dir) / "logits.json").read_text())
        ids = torch.tensor(ref["input_ids"])
        pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
        with torch.no_grad():
            logits = model(ids, pos, attention_mask=None)
            if tp > 1:  # each TP rank's share of the vocabulary, gathered (gloo has no all_gather_into_tensor)
                parts = [torch.empty_like(logits) for _ in range(tp)]
                dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
                logits = torch.cat(parts, dim=-1)
        want = torch.tensor(ref["logits"], dtype=torch.float32)
        max_abs_diff = (logits[..., :vocab] - want).abs().max().item()
    results = [None] * ws
    dist.all_gather_object(results, {"tensors": len(a), "differ": differ, "padded_nonzero": padded_nonzero,
                                     "max_abs_diff": max_abs_diff})
    if rank == 0:
        diffs = [r["max_abs_diff"] for r in results if r["max_abs_diff"] is not None]
        Path(out).write_text(json.dumps({
            "ranks": ws, "tensors": sum(r["tensors"] for r in results),
            "differ": [d for r in results for d in r["differ"]],
            "padded_nonzero": [d for r in results for d in r["padded_nonzero"]],
            "max_abs_diff": max(diffs) if diffs else None}))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 8:
        sys.exit(__doc__)
    original, ours, case_dir, out = *sys.argv[1:4], sys.argv[7]
    tp, pp, ep = (int(a) for a in sys.argv[4:7])
    mp.spawn(job, args=(tp * pp * ep, free_port(), tp, pp, ep, original, ours, case_dir, out), nprocs=tp * pp * ep,
             join=True)
