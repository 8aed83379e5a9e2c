"""Print docs/trainer.md's "what fits where" table (Markdown) from grpo_core/train/memory_model.py, so it
can be regenerated when the model or the trainer changes: Qwen2.5 0.5B / 1.5B / 3B / 7B, full
fine-tuning or LoRA, gradient checkpointing off or on, and for a 24 / 48 / 80 GB GPU the most
rows per forward/backward micro-batch (whole groups of 8, up to 64 = 8 prompts x 8) whose step
peak fits, at 512 and at 2048 new tokens. tests/test_memory_model.py checks the memory model
against CPU measurements and that docs/trainer.md holds this script's table.

    python bench/memory_table.py
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.train.memory_model import GIB, QWEN2_5, Step, estimate, largest_rows  # noqa: E402

GPUS_GB = (24, 48, 80)
NEW_TOKENS = (512, 2048)
PROMPT_TOKENS = 256
GROUP_SIZE = 8
HEADROOM = 0.9  # of the card for tensors: the CUDA context and the caching allocator's fragmentation take the rest
LORA_RANK = 16


def cell(arch, step: Step, gb: int) -> str:
    """'rows at 512 / rows at 2048' new tokens; '-' where one group does not fit."""
    fits = [largest_rows(arch, dataclasses.replace(step, completion_tokens=n), gb * 1e9 / GIB * HEADROOM)
            for n in NEW_TOKENS]
    return " / ".join(str(r) if r else "-" for r in fits)


def table() -> list[str]:
    head = ["model", "training", "checkpointing", "weights + grads + AdamW"] + [f"{gb} GB" for gb in GPUS_GB]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, arch in QWEN2_5.items():
        for lora in (0, LORA_RANK):
            for ckpt in (False, True):
                step = Step(rows=GROUP_SIZE, prompt_tokens=PROMPT_TOKENS, completion_tokens=NEW_TOKENS[0],
                            group_size=GROUP_SIZE, lora_rank=lora, gradient_checkpointing=ckpt)
                held = estimate(arch, step).held / 1e9
                cells = [name, f"LoRA r{lora}" if lora else "full", "on" if ckpt else "off", f"{held:.1f} GB"]
                lines.append("| " + " | ".join(cells + [cell(arch, step, gb) for gb in GPUS_GB]) + " |")
    return lines


def main() -> int:
    print(f"Most rows per micro-batch (grpo.micro_batch_groups x {GROUP_SIZE}) at {NEW_TOKENS[0]} / "
          f"{NEW_TOKENS[1]} new tokens, {PROMPT_TOKENS}-token prompts, bf16 compute over fp32 weights, "
          f"256 MB log-prob chunks; '-': not one group of {GROUP_SIZE}.\n")
    print("\n".join(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
