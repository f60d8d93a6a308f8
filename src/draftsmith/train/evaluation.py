"""`train --eval-prompts FILE --eval-every N`: real speculative decoding of the drafter being trained.

At each eval point the drafter (in eval mode, under the run's autocast) drafts for the frozen
target on a few held-out prompts with the KV-cached greedy loop of `model.speculative` (the loop
`eval` measures), and the run logs tau = tokens committed per target forward, averaged over every
cycle of every prompt. This is the acceptance a server would see, not the training-time estimate
(`train_tau`, from teacher-forced blocks). The best tau so far is kept as `<out>/drafter-best`.

Prompts are rendered with the target's chat template and the template kwargs the data was
tokenized with (the tokenize manifest's record), so the eval sees what training saw.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from draftsmith.core.errors import InputError
from draftsmith.train.checkpoints import RECORD_FILE

BEST_DIR = "drafter-best"


def published_best(out_dir: Path) -> tuple[float, int] | None:
    """(tau, step) of the `<out>/drafter-best` on disk, from its record; None without one.

    It can be newer than the checkpoint a run resumes from (a crash between publishing a best and
    the next checkpoint, or a resume from an older checkpoint): the run keeps the better of the two,
    so a later, worse eval never replaces a better published drafter.
    """
    path = Path(out_dir) / BEST_DIR / RECORD_FILE
    try:
        record = json.loads(path.read_text())
        return float(record["eval_tau"]), int(record["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record (or an older run's drafter-best without one): nothing to keep


def encode_prompts(path: Path, target_dir: Path, template: dict | None, limit: int) -> tuple[list[list[int]], list[int]]:
    """The token ids of the first `limit` prompts of `path`, through the target's chat template, and
    the ids that end a turn (the template's end of turn, generation_config's and the tokenizer's eos)."""
    from transformers import AutoTokenizer

    from draftsmith.data.prompts import generation_prompt_ids, load_prompts
    from draftsmith.data.turns import end_of_turn_ids
    from draftsmith.model.target import generation_stop_ids

    prompts, _ = load_prompts(path)
    if not prompts:
        raise InputError(f"{path}: --eval-prompts holds no prompt")
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    kwargs = (template or {}).get("kwargs") or {}
    encoded = [generation_prompt_ids(tokenizer, prompt.messages, prompt.tools, kwargs) for prompt in prompts[:limit]]
    return encoded, end_of_turn_ids(tokenizer, generation_stop_ids(target_dir), kwargs)


class SpeculativeEval:
    """Loaded once before training (bad prompts fail before the first step); `run` at each eval point."""

    def __init__(self, config, trainer, template: dict | None):
        self.prompts, self.stops = encode_prompts(config.eval_prompts, config.target, template, config.eval_max_prompts)
        self.max_new_tokens = config.eval_max_new_tokens
        self.config, self.trainer = config, trainer
        self._target = trainer.target  # online: the training target; offline: loaded at the first eval

    def target(self):
        if self._target is None:
            from draftsmith.model.target import load_target_model

            self._target = load_target_model(self.config.target, self.trainer.device, self.trainer.target_dtype)
        return self._target

    @torch.no_grad()
    def run(self) -> dict:
        """{"eval_tau", "eval_tokens", "eval_cycles", "eval_s"} over every prompt."""
        from draftsmith.model.speculative import speculative_decode

        target, drafter, stops = self.target(), self.trainer.drafter, self.stops
        started, tokens, cycles = time.perf_counter(), 0, 0
        drafter.eval()
        try:
            with self.trainer.autocast():
                for ids in self.prompts:
                    input_ids = torch.tensor([ids], dtype=torch.long, device=self.trainer.device)
                    result = speculative_decode(target, drafter, input_ids, self.max_new_tokens, stop_token_ids=stops)
                    # The first token comes from the prompt's forward; each cycle (one target forward) commits the rest.
                    tokens += sum(result.acceptance_lengths)
                    cycles += len(result.acceptance_lengths)
        finally:
            drafter.train()
        return {"eval_tau": tokens / max(cycles, 1), "eval_tokens": tokens, "eval_cycles": cycles,
                "eval_s": time.perf_counter() - started}  # fmt: skip
