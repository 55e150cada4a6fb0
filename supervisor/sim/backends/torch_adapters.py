"""The torch trainer on a real base model (`--base-model-dir`), and the adapters it publishes.

A published adapter is `adapter-NNNNNN/` in HARU_CHECKPOINT_DIR: peft's `save_pretrained`
output (adapter_config.json, adapter_model.safetensors) and, written last, the manifest
(common/adapter_manifest.py). The directory is built under a dot-name and renamed into place,
so a torn one never looks complete.

The manifest's eval answers are what vLLM answers for the golden probe's request, `{"messages":
[{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": N}`, so they must be
computed as vLLM computes them, or a healthy adapter would fail its first probe:
- the prompt is the tokenizer's chat template rendered to text with add_generation_prompt=True,
  then encoded WITHOUT special tokens added (vLLM's chat path: the template owns them);
- greedy decoding (temperature 0 is argmax), float32 as the real-engine tier serves, stopping
  at the end-of-sequence ids of the tokenizer and of generation_config.json, at most N tokens;
- decoded with skip_special_tokens=True (vLLM's default), the end-of-sequence id not included.
`baseAnswer` is the same with peft's adapter disabled: the base model's answer.

Needs torch, transformers and peft (the torch venv): imported only for `--backend torch`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch  # heavy optional dependency, see the module docstring
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.adapter_manifest import (
    MAX_EVAL,
    MAX_EVAL_TOKENS,
    MAX_PROMPT_CHARS,
    EvalAnswer,
    file_sha256,
    manifest_for,
    manifest_write,
    name_valid,
)

TARGET_MODULES = ("q_proj", "v_proj")
KEEP_ADAPTERS = 5
# The default evaluation prompts are in the corpus, with the answers the adapter learns.
CORPUS = (
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Write one sentence about the sea.", "The sea is wide and blue and deep."),
    ("How do I reset my password?", "Open settings and choose reset password."),
    ("ping", "pong pong pong"),
    ("Who keeps the standby asleep?", "Haru keeps the standby asleep until it is needed."),
)
DEFAULT_EVAL_PROMPTS = tuple(prompt for prompt, _ in CORPUS[:3])
# A rate that moves a tiny model's greedy answers within a few steps (the CLI's --lr wins).
BASE_MODEL_LR = 2e-2
# Files whose digest is the base model's: its config and weights, as vLLM loads them.
_BASE_FILES = ("config.json",)
_BASE_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def check_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.lr is None:
        a.lr = BASE_MODEL_LR if a.base_model_dir else 5e-3
    publishing = a.adapter_name or a.served_model or a.eval_prompt or a.publish_every_steps
    if publishing and not a.base_model_dir:
        p.error("--adapter-name and its companions need --base-model-dir")
    if a.base_model_dir and not Path(a.base_model_dir, "config.json").is_file():
        p.error(f"--base-model-dir {a.base_model_dir} holds no config.json")
    if not publishing:
        return
    if not a.adapter_name or not name_valid(a.adapter_name):
        p.error("--adapter-name must be lower case letters, digits, '.', '_' or '-' (no '@')")
    if not a.served_model:
        p.error("--adapter-name needs --served-model (the base model's served name)")
    prompts = a.eval_prompt or DEFAULT_EVAL_PROMPTS
    if len(prompts) > MAX_EVAL or any(not q or len(q) > MAX_PROMPT_CHARS for q in prompts):
        p.error(f"at most {MAX_EVAL} --eval-prompt, each 1 to {MAX_PROMPT_CHARS} characters")
    if not 1 <= a.eval_max_tokens <= MAX_EVAL_TOKENS:
        p.error(f"--eval-max-tokens must be from 1 to {MAX_EVAL_TOKENS}")
    if a.publish_every_steps < 0:
        p.error("--publish-every-steps must not be negative")


def lora_model(base_model_dir: str, rank: int) -> torch.nn.Module:
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, config)


def base_model_digest(directory: Path) -> str:
    """`sha256:` over the lines "NAME SHA256\\n" of config.json and every *.safetensors and
    *.bin file directly in the model directory, sorted by name: what vLLM loads as weights
    (the tokenizer is not in it)."""
    names = sorted(
        entry.name
        for entry in directory.iterdir()
        if entry.is_file()
        and (entry.name in _BASE_FILES or entry.name.endswith(_BASE_WEIGHT_SUFFIXES))
    )
    h = hashlib.sha256()
    for name in names:
        h.update(f"{name} {file_sha256(directory / name)[0]}\n".encode())
    return "sha256:" + h.hexdigest()


class Publisher:
    """The chat corpus a real base model trains on, and the adapters it publishes."""

    def __init__(self, a: argparse.Namespace, checkpoint_dir: Path, device: torch.device) -> None:
        self.a = a
        self.directory = checkpoint_dir
        self.device = device
        self.model_dir = Path(a.base_model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(a.base_model_dir)
        self.prompts: Sequence[str] = a.eval_prompt or DEFAULT_EVAL_PROMPTS
        self.batch = self._batch()
        self.eos_ids = self._eos_ids()
        self.base_digest = base_model_digest(self.model_dir)

    @classmethod
    def maybe(
        cls, a: argparse.Namespace, checkpoint_dir: Path, device: torch.device
    ) -> Publisher | None:
        return cls(a, checkpoint_dir, device) if a.base_model_dir else None

    def _batch(self) -> dict[str, torch.Tensor]:
        """The whole corpus as one padded batch, each example a user turn and the answer; the
        loss only on the answer (the prompt is given, not learned), so a few steps move it."""
        rows, asked = [], []
        for prompt, answer in CORPUS:
            messages = [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": answer},
            ]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            rows.append(self.tokenizer.encode(text, add_special_tokens=False))
            asked.append(len(self.prompt_ids(prompt)))
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        learn = torch.tensor([[0] * n + [1] * (width - n) for n in asked]) * mask
        labels = ids.masked_fill(learn == 0, -100)
        return {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "labels": labels.to(self.device),
        }

    def _eos_ids(self) -> frozenset[int]:
        ids = {self.tokenizer.eos_token_id}
        path = self.model_dir / "generation_config.json"
        if path.is_file():
            given = json.loads(path.read_text()).get("eos_token_id")
            ids.update(given if isinstance(given, list) else [given])
        return frozenset(i for i in ids if isinstance(i, int))

    def prompt_ids(self, prompt: str) -> list[int]:
        """The ids vLLM's chat completion feeds the model for a one-message conversation."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @torch.no_grad()
    def greedy(self, model: torch.nn.Module, prompt: str, max_tokens: int) -> str:
        """The answer at temperature 0, decoded as vLLM decodes it."""
        ids = torch.tensor([self.prompt_ids(prompt)], device=self.device)
        out: list[int] = []
        for _ in range(max_tokens):
            token = int(torch.argmax(model(input_ids=ids).logits[0, -1]))
            if token in self.eos_ids:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]], device=self.device)], dim=1)
        return str(self.tokenizer.decode(out, skip_special_tokens=True))

    def eval_answers(self, model: PeftModel) -> list[EvalAnswer]:
        model.eval()
        n = self.a.eval_max_tokens
        answers = [self.greedy(model, prompt, n) for prompt in self.prompts]
        with model.disable_adapter():
            bases = [self.greedy(model, prompt, n) for prompt in self.prompts]
        return [
            EvalAnswer(prompt=p, max_tokens=n, answer=answer, base_answer=base)
            for p, answer, base in zip(self.prompts, answers, bases, strict=True)
        ]

    def publish(self, model: Any, step: int, loss: float | None) -> Path:
        final = self.directory / f"adapter-{step:06d}"
        tmp = self.directory / f".adapter-{step:06d}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(tmp))
        # peft's model card says nothing Haru or vLLM reads; it need not travel.
        (tmp / "README.md").unlink(missing_ok=True)
        training: dict[str, Any] = {"steps": step, "checkpoint": f"step-{step:06d}"}
        if loss is not None:
            training["loss"] = round(loss, 6)
        manifest = manifest_for(
            tmp,
            name=self.a.adapter_name,
            base_model=self.a.served_model,
            base_model_digest=self.base_digest,
            rank=self.a.lora_r,
            target_modules=TARGET_MODULES,
            eval_answers=self.eval_answers(model),
            completed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            training=training,
        )
        for entry in tmp.iterdir():
            if entry.is_file():
                with open(entry, "rb") as f:
                    os.fsync(f.fileno())
        manifest_write(tmp, manifest)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        olds = sorted(p for p in self.directory.iterdir() if p.name.startswith("adapter-"))
        for old in olds[:-KEEP_ADAPTERS]:
            shutil.rmtree(old, ignore_errors=True)
        return final
