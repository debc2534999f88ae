"""The schema of generate.py's config (configs/generate.yaml): eval's, and what sampling text takes."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from .schema import EvalConfig
from .values import number, require, whole_number


@dataclass
class GenerateConfig(EvalConfig):
    """generate.py's keys (configs/generate.yaml); the model comes from ckpt_path's saved config."""

    prompt: str = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_k: int | None = None
    tokenizer: str | None = None

    def check(self) -> None:
        super().check()
        require(self.prompt != "", 'prompt= is empty: give the text to continue, prompt="..."')
        whole_number("max_new_tokens", self.max_new_tokens, 1)
        number("temperature", self.temperature, 0)
        if self.top_k is not None:
            whole_number("top_k", self.top_k, 1)


# The schemas this module adds, found by compose.register_configs by what is present (common/registry.py).
SCHEMAS = {"generate": GenerateConfig}
