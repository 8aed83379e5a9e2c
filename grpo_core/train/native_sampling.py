"""The native sampler: a step's completions sampled with the KV cache, and the Rollouts every sampler returns.

`rollout` samples G completions for each prompt on the trainer's own model (each prompt
prefilled once, its KV cache copied to its G rows); `Rollouts` is the padded batch the trainer
scores and trains on, whoever sampled it (train/sampling.py picks the sampler; a vLLM engine's
Rollouts also carry its log-probs). G may differ per prompt (a list of sizes: per-prompt
budgets, train/budgets.py): group g's rows then follow group g-1's, and `Rollouts.sizes` says
how many each has.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Rollouts:
    input_ids: torch.Tensor  # [B, Lp + Lc]: left-padded prompt, then the completion (pad after eos)
    attention_mask: torch.Tensor  # [B, Lp + Lc]: 0 on padding and after eos
    prompt_len: int  # Lp
    texts: list[str]  # [B] decoded completions
    examples: list[dict]  # [B] each prompt's example, repeated for each of its group's rows
    num_prompts: int
    group_size: int  # G; with per-group sizes, the largest
    prompts: list[str]  # [P] each group's prompt text as the model read it (a rendered chat template)
    sampler_logprobs: torch.Tensor | None = None  # [B, Lc] the engine's log-prob of each sampled token (vLLM)
    sizes: list[int] | None = None  # [P] each group's rows when they differ (None: every group has G)

    def group_sizes(self) -> np.ndarray:
        """[P] each group's rows."""
        return np.full(self.num_prompts, self.group_size, np.int64) if self.sizes is None \
            else np.asarray(self.sizes, np.int64)

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.attention_mask[:, self.prompt_len:]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len:]


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's eos and those of the model's
    generation_config (Qwen and Llama 3 list several: `generate` stops at any of them)."""
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    listed = [] if listed is None else [listed] if isinstance(listed, int) else list(listed)
    return list(dict.fromkeys([tokenizer.eos_token_id, *listed]))


def completion_mask(completion_ids: torch.Tensor, eos_ids: int | list[int]) -> torch.Tensor:
    """1 on every token up to and including the first eos (any of eos_ids), 0 after (no Python loop)."""
    is_eos = torch.isin(completion_ids, torch.as_tensor(eos_ids, device=completion_ids.device))
    before = is_eos.long().cumsum(-1) - is_eos.long()  # eos seen strictly before this position
    return (before == 0).long()


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Top-k filter with generate's arithmetic (TopKLogitsWarper): every token scoring below
    the k-th best is dropped (ties with it kept)."""
    kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1, None]
    return scores.masked_fill(scores < kth, float("-inf"))


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter with generate's arithmetic (TopPLogitsWarper): sort ascending, drop the
    tail whose cumulative mass is <= 1 - top_p, always keep the most likely token."""
    sorted_logits, order = torch.sort(scores, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


@contextmanager
def mode(model, training: bool):
    """The model in train or eval mode for a block, then as it was. Sampling runs in eval mode
    (gradient checkpointing, on in train mode, would turn the KV cache off), training in train
    mode (where checkpointing applies)."""
    was = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was)


@torch.no_grad()
def sample_tokens(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int | list[int], *,
                  max_new_tokens: int, eos_ids: int | list[int], pad_id: int, temperature: float = 1.0,
                  top_p: float = 1.0, top_k: int = 0,
                  suppress_ids: list[int] | None = None, generators: list[torch.Generator] | None = None,
                  ) -> torch.Tensor:
    """`model.generate(do_sample=True, top_k=0, num_return_sequences=G, suppress_tokens=...)`
    for left-padded prompts [P, Lp] -> completion ids [P*G, Lc], pad after each row's eos (any
    of eos_ids), stopping once every row has ended; temperature 0 is greedy. Same logits processing (suppress, temperature, top-p)
    and the same multinomial draws in the same order, so a seed gives generate's tokens
    (tests/test_trainer.py). Faster where it matters on a small model: each prompt goes
    through the model once, not G times (its KV cache is copied to its G rows; the prefill of
    every row was a large share of generate's time: docs/benchmarks.md, "Behind the code"), rows
    that have ended leave the model's batch (once a quarter of it has ended), and none of
    generate's per-token bookkeeping runs.

    `generators` (one per prompt) draw each group's tokens from its own stream instead of
    torch's global one: a group's completions then do not depend on the other prompts of the
    batch (the trainer seeds each group: ranks.group_seeds). `group_size` a list: prompt g gets
    group_size[g] rows (its cache rows selected that many times)."""
    eos = torch.as_tensor(eos_ids, device=prompt_ids.device)
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if isinstance(group_size, int):
        cache.batch_repeat_interleave(group_size)
    else:
        group_size = torch.as_tensor(group_size, device=prompt_ids.device)
        rows = torch.arange(len(group_size), device=prompt_ids.device)
        cache.batch_select_indices(rows.repeat_interleave(group_size))  # prompt g's cache rows, group_size[g] times
    logits = out.logits[:, -1].float().repeat_interleave(group_size, 0)  # [B, V], B = P*G
    mask = prompt_mask.repeat_interleave(group_size, 0)
    nxt = pos[:, -1:].repeat_interleave(group_size, 0) + 1  # generate's positions: count of attended tokens - 1
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    rows = torch.arange(logits.shape[0], device=logits.device)  # the rows still in the model's batch
    toks = []
    for t in range(max_new_tokens):
        scores = logits
        if suppress_ids:
            scores[:, suppress_ids] = float("-inf")
        if temperature == 0:  # greedy (held-out evaluation): no draw
            tok = scores.argmax(-1).masked_fill(done, pad_id)
        else:
            if temperature != 1.0:
                scores = scores / temperature
            if top_k > 0:  # generate's order: temperature, top-k, top-p
                scores = _top_k(scores, top_k)
            if top_p < 1.0:
                scores = _top_p(scores, top_p)
            # Drawn for every row, ended ones too (then replaced by pad): the random stream is generate's.
            tok = _draw(scores.softmax(-1), group_size, generators).masked_fill(done, pad_id)
        toks.append(tok)
        done = done | torch.isin(tok, eos)
        if t == max_new_tokens - 1:
            break
        live = ~done[rows]  # rows outside the batch have ended already
        n_live = int(live.sum())  # the one host sync per token (generate has one too)
        if n_live == 0:
            break
        if n_live <= 3 * len(rows) // 4:
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, mask, nxt = rows[keep], mask[keep], nxt[keep]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        out = model(input_ids=tok[rows, None], attention_mask=mask, position_ids=nxt, past_key_values=cache,
                    use_cache=True)
        nxt = nxt + 1
        logits[rows] = out.logits[:, -1].float()  # an ended row keeps its last logits: only drawn from
    return torch.stack(toks, 1)


def _draw(probs: torch.Tensor, group_size, generators: list[torch.Generator] | None) -> torch.Tensor:
    """One token per row [B] from probs [B, V]: from torch's generator, or each group's rows from its own."""
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(1)
    split = group_size if isinstance(group_size, int) else group_size.tolist()
    return torch.cat([torch.multinomial(rows, 1, generator=gen).squeeze(1)
                      for rows, gen in zip(probs.split(split), generators)])


def rollout(model, tokenizer, examples: list[dict], group_size: int | list[int], *, max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, suppress_ids: list[int] | None = None,
            batch_groups: int = 0, add_special_tokens: bool = True, prompts: list[str] | None = None,
            seeds: list[int] | None = None) -> Rollouts:
    """P prompts -> P*G sampled completions (KV cache, each prompt prefilled once), in batches
    of `batch_groups` prompts (0: one batch) so the KV cache held is one batch's. Rows are
    grouped: rows g*G .. g*G+G-1 are prompt g's group. `prompts`: the text each example is
    prompted with (default: its "prompt"); add_special_tokens=False when they are rendered chat
    templates, which hold the model's special tokens already. `seeds` (one per prompt): each
    group drawn from its own generator, so its completions are the same in any batch. `group_size`
    a list (one per prompt): groups of different sizes (Rollouts.sizes)."""
    prompts = [e["prompt"] for e in examples] if prompts is None else list(prompts)
    if 0 < batch_groups < len(examples):
        parts = [rollout(model, tokenizer, examples[i:i + batch_groups],
                         group_size if isinstance(group_size, int) else group_size[i:i + batch_groups],
                         max_new_tokens=max_new_tokens,
                         temperature=temperature, top_p=top_p, top_k=top_k, suppress_ids=suppress_ids,
                         add_special_tokens=add_special_tokens, prompts=prompts[i:i + batch_groups],
                         seeds=None if seeds is None else seeds[i:i + batch_groups])
                 for i in range(0, len(examples), batch_groups)]
        return concat_rollouts(parts, tokenizer.pad_token_id)
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True,
                    add_special_tokens=add_special_tokens).to(device)
    eos = eos_token_ids(model, tokenizer)
    generators = None if seeds is None else [torch.Generator(device).manual_seed(int(s)) for s in seeds]
    with mode(model, training=False):
        comp = sample_tokens(model, enc["input_ids"], enc["attention_mask"], group_size,
                             max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=tokenizer.pad_token_id,
                             temperature=temperature, top_p=top_p, top_k=top_k, suppress_ids=suppress_ids,
                             generators=generators)
    return assemble(tokenizer, enc, comp, completion_mask(comp, eos), examples, group_size, prompts)


def assemble(tokenizer, enc, completion: torch.Tensor, cmask: torch.Tensor, examples: list[dict],
             group_size: int | list[int], prompts: list[str], sampler_logprobs: torch.Tensor | None = None) -> Rollouts:
    """Rollouts from the encoded prompts [P, Lp] and the completions [P*G, Lc] with their mask (any
    sampler's): each prompt repeated for its G rows, pad wherever the mask is 0, the texts decoded."""
    lp = enc["input_ids"].shape[1]
    sizes = [group_size] * len(examples) if isinstance(group_size, int) else [int(n) for n in group_size]
    reps = group_size if isinstance(group_size, int) else torch.as_tensor(sizes, device=enc["input_ids"].device)
    attn = torch.cat([enc["attention_mask"].repeat_interleave(reps, 0), cmask], 1)
    out = torch.cat([enc["input_ids"].repeat_interleave(reps, 0), completion], 1).masked_fill(
        attn == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, lp:], skip_special_tokens=True)
    rep = [e for e, n in zip(examples, sizes) for _ in range(n)]
    fixed = isinstance(group_size, int)
    return Rollouts(out, attn, lp, texts, rep, len(examples), group_size if fixed else max(sizes, default=0), prompts,
                    sampler_logprobs, None if fixed else sizes)


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Join rollouts of several prompt batches (dynamic sampling) into one padded batch."""
    if len(parts) == 1:
        return parts[0]
    lp = max(r.prompt_len for r in parts)
    lc = max(r.input_ids.shape[1] - r.prompt_len for r in parts)
    ids, masks, sampled = [], [], []
    for r in parts:
        left, right = lp - r.prompt_len, lc - (r.input_ids.shape[1] - r.prompt_len)
        ids.append(torch.nn.functional.pad(r.input_ids, (left, right), value=pad_id))
        masks.append(torch.nn.functional.pad(r.attention_mask, (left, right), value=0))
        if r.sampler_logprobs is not None:
            sampled.append(torch.nn.functional.pad(r.sampler_logprobs, (0, right), value=0.0))
    varied = any(r.sizes is not None for r in parts)  # groups of different sizes: the sizes carried on
    return Rollouts(torch.cat(ids), torch.cat(masks), lp, sum((r.texts for r in parts), []),
                    sum((r.examples for r in parts), []), sum(r.num_prompts for r in parts),
                    max(r.group_size for r in parts) if varied else parts[0].group_size,
                    sum((r.prompts for r in parts), []), torch.cat(sampled) if len(sampled) == len(parts) else None,
                    [int(n) for r in parts for n in r.group_sizes()] if varied else None)
