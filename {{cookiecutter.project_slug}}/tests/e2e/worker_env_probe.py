"""Run under torchrun, as a module, by tests/e2e/test_launch.py: prints, as one JSON line, what each
worker sees of its launch. It imports nothing heavy (not torch): the test stays quick."""

import json
import os

if __name__ == "__main__":
    names = ("RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES")
    print(json.dumps({name: os.environ.get(name) for name in names}), flush=True)
