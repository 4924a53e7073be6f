"""What transformers' from_pretrained reads of a Hugging Face folder, for the
tests to compare ckptconv's reading with (run in .venv-hf):

    .venv-hf/bin/python tests/hf_state_dict.py FOLDER OUT.pt

Saves model.state_dict() (fp32, tied keys included) to OUT.pt. When
from_pretrained refuses the folder, prints "refused: <exception>" and exits 3."""

import sys

import torch
import transformers


def main(folder: str, out: str) -> int:
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except (ValueError, OSError, EnvironmentError) as e:
        print(f"refused: {type(e).__name__}: {e}")
        return 3
    torch.save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
