"""torch's side of scripts/bench's Hugging Face rows (tools/bench.py hf), one
process, no process group (what a user without ckptconv runs offline):

    python tools/bench_hf_torch.py hf-to-dcp SRC_HF_FOLDER OUT_DCP_DIR
        HuggingFaceStorageReader + dcp.load of the whole model, then dcp.save
        (FileSystemWriter) at world size 1: a job at N reshards it at load.
    python tools/bench_hf_torch.py dcp-to-hf SRC_DCP_DIR OUT_FOLDER
        dcp.load of the whole checkpoint, then dcp.save with
        HuggingFaceStorageWriter (one model-00001-of-00001.safetensors + index).
    python tools/bench_hf_torch.py consolidate SRC_DCP_HF_DIR OUT_FOLDER
        torch's consolidate_safetensors_files of per-rank HF-layout files.
"""
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, HuggingFaceStorageReader, \
    HuggingFaceStorageWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def empty_state(reader) -> dict:
    md = reader.read_metadata()
    return {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}


def main() -> None:
    mode, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "hf-to-dcp":
        reader = HuggingFaceStorageReader(src)
        state = empty_state(reader)
        dcp.load(state, storage_reader=reader, no_dist=True)
        dcp.save(state, storage_writer=FileSystemWriter(out), no_dist=True)
    elif mode == "dcp-to-hf":
        reader = FileSystemReader(src)
        state = empty_state(reader)
        dcp.load(state, storage_reader=reader, no_dist=True)
        Path(out).mkdir(parents=True, exist_ok=True)
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(out), no_dist=True)
    elif mode == "consolidate":
        from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
        Path(out).mkdir(parents=True, exist_ok=True)
        keys = HuggingFaceStorageReader(src).read_metadata().state_dict_metadata
        consolidate_safetensors_files(input_dir=src, output_dir=out, fqn_to_index_mapping=dict.fromkeys(keys, 1))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
