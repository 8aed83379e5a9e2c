"""The worked example's inputs (docs/worked_example.md): an arithmetic JSONL, a held-out one,
and the real-architecture test model (tests/real_model.py: Qwen2 at random init, byte-level
BPE, a chat template, two eos ids) after a short supervised warm-start on the training rows.

A random-init model is never right, so every GRPO group would tie at reward 0 and nothing
would train; the warm-start (grpo_core.train.models.warm_start, the one the built-in model gets)
stops once 30% of sampled answers to training prompts are right: a policy that is sometimes
right, which is what GRPO needs. Each prompt is rendered with grpo_core.tasks.chat.render, the call
the trainer makes, so the model learns on exactly the text GRPO later feeds it.

    .venv/bin/python docs/examples/arithmetic/make.py --out arithmetic
writes arithmetic/train.jsonl, arithmetic/held_out.jsonl and arithmetic/model/.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: grpo_core and tests/real_model.py

SYSTEM = "Reply with the number only."


def problems(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Every a + b and a - b (a >= b) with a, b in 0..9, as chat messages; 1 in 5 held out."""
    rows = []
    for a in range(10):
        for b in range(10):
            rows.append({"prompt": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b})
            if a >= b:
                rows.append({"prompt": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": f"What is {a} - {b}?"}], "answer": a - b})
    random.Random(seed).shuffle(rows)
    cut = len(rows) // 5
    return rows[cut:], rows[:cut]


class Rendered:
    """The JSONL task as warm_start reads it (warm_batch, target), each prompt rendered."""

    def __init__(self, task, tokenizer):
        from grpo_core.tasks.chat import render
        self.task, self.render = task, lambda p: render(tokenizer, p)  # task.chat_template=auto, as the trainer

    def warm_batch(self, n: int) -> list[dict]:
        return [{**e, "prompt": self.render(e["prompt"])} for e in self.task.warm_batch(n)]

    def target(self, example: dict) -> str:
        return self.task.target(example)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="arithmetic", help="folder for train.jsonl, held_out.jsonl and model/")
    ap.add_argument("--warm-steps", type=int, default=400, help="cap on supervised steps (stops at 30%% right)")
    args = ap.parse_args()
    if args.warm_steps < 1:
        ap.error("--warm-steps must be >= 1")

    import torch
    from grpo_core.train.models import load_pretrained, set_threads, warm_start
    from grpo_core.tasks.jsonl import JsonlTask
    from tests.real_model import build

    set_threads()  # $GRPO_HEALTH_TORCH_THREADS, else 1: the model is too small to split across cores

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = problems()
    for name, rows in (("train.jsonl", train), ("held_out.jsonl", held_out)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(train)} training rows, {len(held_out)} held out")

    torch.manual_seed(0)
    model, tokenizer = load_pretrained(str(build(out / ".build")))  # left padding, as the trainer loads it
    task = JsonlTask(out / "train.jsonl", ["math_answer"])
    example = Rendered(task, tokenizer).warm_batch(1)[0]
    print("the model reads:", repr(example["prompt"] + task.target(example)))
    losses, rate = warm_start(model, tokenizer, Rendered(task, tokenizer), max_steps=args.warm_steps, lr=3e-3)
    print(f"warm-start: {len(losses)} steps, loss {losses[0]:.2f} -> {losses[-1]:.2f}, "
          f"{rate:.0%} of sampled answers right")
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    print(f"model: {out / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
