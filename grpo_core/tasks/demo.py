"""The built-in demo: "answer and cite your source", a research-agent task in miniature.

The prompt asks a question, shows a few short sources (a fact and its id each), and the
completion answers with the fact's value and cites the source it came from:

    Q: ice? sun=hot [S1] ice=red [S2] A:        ->   red [S2]

The answer is the queried key's value followed by the id of the source it came from.
Five metrics of the kinds real runs mix (config.DEMO_WEIGHTS): answer_f1 (continuous),
exact (binary), citation (binary), format (binary), length (graduated penalty).

Character-level and learnable by a ~100k-parameter model. The question comes first on
purpose: with it last, a 2-layer model needs far more supervised steps to learn the key
lookup (docs/benchmarks.md, "Behind the code"); with it first, each source's key can attend
back to the question while it is read. Harder levels are the
same skill under more pressure. Levels (task.level, changeable mid-run):
  1: 2 sources, one-word values
  2: 3 sources, one-word values
  3: 4 sources, one- or two-word values
  4: 5 sources, two-word values, distractor keys that share their first letters
"""
from __future__ import annotations

import random

from grpo_core.runs.config import DEMO_WEIGHTS
from grpo_core.tasks.task import StreamTask, prompt_id

KEYS = ["sun", "ice", "cat", "dog", "sky", "sea", "oak", "owl", "fox", "bee", "elk", "ant",
        "cow", "eel", "yak", "emu", "bat", "jay", "ram", "hen"]
# Distractor families: keys that differ only in the last letter (level 4).
NEAR = {"sun": ["sum", "sub"], "cat": ["car", "cap"], "dog": ["dot", "don"], "sea": ["set", "sew"],
        "oak": ["oat", "oar"], "bee": ["bed", "bet"], "bat": ["bar", "bay"], "ram": ["rat", "rag"]}
VALUES = ["hot", "red", "big", "old", "wet", "dry", "new", "low", "tall", "cold", "dark", "blue",
          "fast", "slow", "soft", "loud", "tiny", "bold", "calm", "gray"]

LEVELS = {
    1: dict(sources=1, words=(1, 1), near=False),
    2: dict(sources=2, words=(1, 1), near=False),
    3: dict(sources=3, words=(1, 2), near=False),
    4: dict(sources=4, words=(2, 2), near=True),
}
VERSION = 2  # bump when the prompt layout changes: invalidates cached warm-starts


def make_example(rng: random.Random, level: int) -> dict:
    spec = LEVELS[level]
    n = spec["sources"]
    if spec["near"]:
        head = rng.choice(sorted(NEAR))
        near = rng.sample(NEAR[head], k=min(2, n - 1))
        rest = rng.sample([k for k in KEYS if k != head and k not in near], n - 1 - len(near))
        keys = [head] + near + rest
        rng.shuffle(keys)
        asked = head
    else:
        keys = rng.sample(KEYS, n)
        asked = rng.choice(keys)
    values = [" ".join(rng.sample(VALUES, rng.randint(*spec["words"]))) for _ in keys]
    facts = " ".join(f"{k}={v} [S{i + 1}]" for i, (k, v) in enumerate(zip(keys, values)))
    i = keys.index(asked)
    prompt = f"Q: {asked}? {facts} A: "
    answer, source = values[i], f"S{i + 1}"
    target = f"{answer} [{source}]"
    return {"prompt": prompt, "answer": answer, "source": source, "prompt_id": prompt_id(prompt),
            "level": level, "max_len": len(target) + 2}


class DemoTask(StreamTask):
    name = "demo"
    levels = len(LEVELS)

    def metrics(self) -> list[str]:
        return list(DEMO_WEIGHTS)

    def make(self, rng: random.Random) -> dict:
        return make_example(rng, self.level)

    def held_out(self, n: int) -> list[dict]:
        """A stream of its own seed (the demo's prompt space is large: a repeat is rare, not excluded)."""
        return DemoTask(level=self.level, seed=f"held-out-{self.seed}").batch(n)

    def target(self, example: dict) -> str:
        return f"{example['answer']} [{example['source']}]"

    def cache_key(self) -> dict:
        return {"name": self.name, "seed": self.seed, "level": self.level, "spec": LEVELS[self.level],
                "version": VERSION}
