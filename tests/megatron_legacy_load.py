"""Loads what ckptconv wrote from a Megatron-LM legacy checkpoint into a model
built by real megatron-core at another TP x PP, and checks that the model it
got is the legacy job's (run by tests/test_megatron_legacy.py in the side
environment .venv-megatron).

    .venv-megatron/bin/python tests/megatron_legacy_load.py KIND OURS TP PP MODEL_REF OUT.json [VPP [ITERATION]]

KIND is ``torch_dist`` (``reshard LEGACY --layout megatron``: loaded with
``dist_checkpointing.load`` into the model's ``sharded_state_dict``) or
``legacy`` (``reshard LEGACY --layout megatron-legacy --tp TP --pp PP``: each
rank torch.loads its ``iter_*/mp_rank_*/model_optim_rng.pt`` and calls
``load_state_dict(state["model"], strict=True)``, which is what Megatron-LM's
``load_checkpoint`` does with a ckpt_format=torch file; its args must say
this TP and PP, which ``check_checkpoint_args`` compares).

Every rank builds the legacy fixture's GPT (the sizes of
tools/make_megatron_legacy_checkpoints.py: 4 layers, 4 heads in 2 query
groups, SwiGLU, biases, learned positions, untied output layer, local spec)
with megatron-core alone at TP x PP, loads OURS, and saves what it loaded
with megatron-core's own ``dist_checkpointing.save``. One TP=1/PP=1
process then loads that save and compares its
``state_dict_for_save_checkpoint()`` with MODEL_REF (megatron-core's own
TP=1/PP=1 reading of the job's weights) bit for bit: the TP x PP pieces are
joined by megatron-core, never by a rule of ours. At PP 1 each rank also takes one training step on a fixed batch from what it
loaded (train_step_losses), and the TP=1/PP=1 process the same step from
MODEL_REF's weights. Writes {"ranks": N, "tensors": compared, "differ": [...],
"unexpected": [...], "common": [...], "losses": [[first], [after the step]]
or null at PP > 1, "ref_losses": the same from MODEL_REF} (common: the
entries of common.pt rank 0's dist_checkpointing.load returned)."""
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_megatron_checkpoints as mk  # noqa: E402
import make_megatron_legacy_checkpoints as legacy  # noqa: E402

EXTRA = {"num_layers": legacy.NUM_LAYERS, "num_attention_heads": legacy.HEADS, "num_query_groups": legacy.GROUPS}


def build(tp, pp):
    _, model = mk.build_model(tp, pp, EXTRA, vocab=legacy.VOCAB, seq=legacy.SEQ, init=False)
    return model


def build_chunks(tp, pp, vpp):
    """The same GPT with `vpp` virtual pipeline stages per pipeline rank:
    one GPTModel per stage (vp_stage v), as Megatron-LM's get_model makes
    them; megatron-core places each stage's layers (the interleaved
    schedule's assignment) and numbers them from 0 in each."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp)
    cfg = TransformerConfig(num_layers=legacy.NUM_LAYERS, hidden_size=mk.HIDDEN, num_attention_heads=legacy.HEADS,
                            num_query_groups=legacy.GROUPS, ffn_hidden_size=mk.FFN, gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, use_cpu_initialization=True,
                            perform_initialization=False, tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                            params_dtype=torch.float32, pipeline_dtype=torch.float32)
    return [GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=legacy.VOCAB,
                     max_sequence_length=legacy.SEQ,
                     pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v),
                     post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v), vp_stage=v)
            for v in range(vpp)]


def train_step_losses(model):
    """One training step on a fixed batch: the per-token losses of a
    forward pass, then of a second one after backward and an SGD step
    (lr 0.1) on this rank's parameters. At PP 1 that is tensor-parallel
    training as megatron-core runs it: the layer norms' and row-parallel
    biases' gradients are whole on every TP rank (its all-reduce in the
    column-parallel input's backward), so no further reduction is due.
    Dropout is off (eval mode), so the CUDA RNG tracker, which this CPU run
    has no states for, draws nothing: its fork is a no-op."""
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    model.eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, legacy.VOCAB, (2, legacy.SEQ), generator=g)
    labels = torch.randint(0, legacy.VOCAB, (2, legacy.SEQ), generator=g)
    positions = torch.arange(legacy.SEQ).unsqueeze(0).expand(2, legacy.SEQ)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = model(tokens, positions, None, labels=labels)
    first.float().mean().backward()
    optimizer.step()
    with torch.no_grad():
        second = model(tokens, positions, None, labels=labels)
    return [first.detach().flatten().tolist(), second.flatten().tolist()]


def load_legacy(model, ours, tp, pp, vpp=1, iteration=7):
    """This rank's file, as Megatron-LM's load_checkpoint reads it (the
    tracker, then the rank folder get_checkpoint_name names)."""
    from megatron.core import parallel_state as ps
    tracker = (Path(ours) / "latest_checkpointed_iteration.txt").read_text().strip()
    folder = "release" if tracker == "release" else f"iter_{int(tracker):07d}"
    t, p = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    rank = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
    state = torch.load(Path(ours) / folder / rank / "model_optim_rng.pt", map_location="cpu", weights_only=False)
    problems = []
    for name, want in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp)):
        if getattr(state["args"], name) != want:
            problems.append(f"args.{name} {getattr(state['args'], name)}")
    if state["checkpoint_version"] != 3.0 or state["iteration"] != iteration:
        problems.append(f"checkpoint_version {state['checkpoint_version']}, iteration {state['iteration']}")
    if vpp > 1:
        if getattr(state["args"], "virtual_pipeline_model_parallel_size", None) != vpp:
            problems.append(f"args.virtual_pipeline_model_parallel_size "
                            f"{getattr(state['args'], 'virtual_pipeline_model_parallel_size', None)}")
        if sorted(k for k in state if k.startswith("model")) != [f"model{v}" for v in range(vpp)]:
            problems.append(f"model entries {sorted(k for k in state if k.startswith('model'))}")
        for v, chunk in enumerate(model):  # Megatron-LM's load_checkpoint: model[i].load_state_dict(state[f"model{i}"])
            chunk.load_state_dict(state[f"model{v}"], strict=True)
        return problems
    model.load_state_dict(state["model"], strict=True)  # raises on a missing or unexpected key, or a wrong shape
    return problems


def load_and_resave(rank, ws, port, kind, tp, pp, ours, resaved, out, vpp=1, iteration=7):
    mk._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    common = []
    if vpp > 1:
        # Each stage's sharded keys are global (megatron-core offsets the
        # layers by the stage): saved together they are the whole model.
        chunks = build_chunks(tp, pp, vpp)
        problems = load_legacy(chunks, ours, tp, pp, vpp, iteration)
        dist_checkpointing.save({f"model{v}": c.sharded_state_dict() for v, c in enumerate(chunks)}, resaved)
        results = [None] * ws
        dist.all_gather_object(results, problems)
        if rank == 0:
            Path(out).write_text(json.dumps({"problems": [p for r in results for p in r], "common": [],
                                             "losses": None}))
        dist.barrier()
        ps.destroy_model_parallel()
        dist.destroy_process_group()
        return
    model = build(tp, pp)
    if kind == "legacy":
        problems = load_legacy(model, ours, tp, pp, iteration=iteration)
    else:
        request = model.sharded_state_dict()
        loaded = dist_checkpointing.load(request, ours)
        common = sorted(set(loaded) - set(request))  # common.pt's entries, merged in by dist_checkpointing.load
        result = model.load_state_dict({k: v for k, v in loaded.items() if k in request}, strict=False)
        problems = [f"missing {k}" for k in result.missing_keys] + [f"unexpected {k}" for k in result.unexpected_keys]
    dist_checkpointing.save(model.sharded_state_dict(), resaved)
    losses = train_step_losses(model) if pp == 1 else None  # a pipeline needs megatron's schedules: not run here
    results = [None] * ws
    dist.all_gather_object(results, problems)
    if rank == 0:
        Path(out).write_text(json.dumps({"problems": [p for r in results for p in r], "common": common,
                                         "losses": losses}))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def compare(rank, ws, port, resaved, model_ref, out):
    mk._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    model = build(1, 1)
    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), resaved), strict=False)
    got = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
           for k, v in model.state_dict_for_save_checkpoint().items()}
    if Path(model_ref).is_dir():
        # A torch_dist checkpoint (what OURS was written from): megatron-core
        # reads it into the same TP=1/PP=1 model, in this run.
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), model_ref), strict=False)
        want = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                for k, v in model.state_dict_for_save_checkpoint().items()}
    else:
        want = torch.load(model_ref, weights_only=False)

    def same(x, y):
        if not isinstance(x, torch.Tensor):
            return type(x) is type(y) and x == y
        return (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))

    differ = sorted(k for k in want if k not in got or not same(got[k], want[k]))
    differ += sorted(set(got) - set(want))
    # The same training step from the legacy job's own weights (megatron-core's reading), at TP=1/PP=1.
    model.load_state_dict(want, strict=True)
    Path(out).write_text(json.dumps({"tensors": sum(isinstance(v, torch.Tensor) for v in want.values()),
                                     "differ": differ, "ref_losses": train_step_losses(model)}))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    kind, ours, tp, pp, model_ref, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:7]
    vpp = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    # The iteration the rank files must hold: the fixture's 7, or 1 for a
    # model written from a Hugging Face folder (as Megatron-LM's converter).
    iteration = int(sys.argv[8]) if len(sys.argv) > 8 else 7
    with tempfile.TemporaryDirectory() as tmp:
        resaved, problems, compared = Path(tmp) / "resaved", Path(tmp) / "problems.json", Path(tmp) / "compared.json"
        resaved.mkdir()
        mp.spawn(load_and_resave, args=(tp * pp, mk.free_port(), kind, tp, pp, ours, str(resaved), str(problems), vpp,
                                         iteration),
                 nprocs=tp * pp, join=True)
        mp.spawn(compare, args=(1, mk.free_port(), str(resaved), model_ref, str(compared)), nprocs=1, join=True)
        report = json.loads(compared.read_text())
        report["ranks"] = tp * pp
        loaded = json.loads(problems.read_text())
        report["unexpected"], report["common"], report["losses"] = loaded["problems"], loaded["common"], loaded["losses"]
        Path(out).write_text(json.dumps(report))
