#!/usr/bin/env python3
"""torch's side of tools/bench.py's s3 rows: dcp_to_torch_save (its body:
_load_state_dict with the empty planner, then torch.save) with the DCP
reader over S3 through fsspec (torch's FsspecReader on s3fs), the way a
user converts a checkpoint in a bucket with torch alone. Credentials come
from the environment as for ckptconv.

    python tools/bench_s3_torch.py s3://BUCKET/PREFIX OUT.pt ENDPOINT
"""
from __future__ import annotations

import sys

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict


def main() -> None:
    url, out, endpoint = sys.argv[1:4]
    sd: dict = {}
    _load_state_dict(sd, storage_reader=FsspecReader(url, endpoint_url=endpoint), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    torch.save(sd, out)


if __name__ == "__main__":
    main()
