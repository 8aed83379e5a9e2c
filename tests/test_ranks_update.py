"""grpo.train_on on two real gloo processes against one process: the same update at the same
global batch, whatever each rank's share holds (grpo_core/train/ranks.py).

Each case builds the same float64 Llama and the same global batch in every process; each rank
trains on its contiguous share (Ranks.share: 3 groups and 2), the single process on all of it. The parameters
after the update agree to float64 round-off (the only difference is the order the two ranks'
partial gradients are added in: measured ~1e-16 relative; asserted at 1e-10 absolute on
weights of order 0.1). Cases: one rank with no trainable group (dropped rows, so
it does no backward at all), different micro-batch counts, an out-of-memory retry on one rank
only, and a step no group trains on. And the safety net behind requests: ranks whose settings
differ fail at the next step boundary."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_core.runs.config import GRPOConfig
from grpo_core.train import grpo, out_of_memory
from grpo_core.train.native_sampling import Rollouts
from grpo_core.train.ranks import SINGLE, Ranks
from tests.helpers_dashboard import free_port

P, G, LP, LC, VOCAB = 5, 4, 3, 5, 40
TRAINABLE = {  # rank 0 takes groups 0-2, rank 1 groups 3-4
    "one rank flat": [1, 0, 1, 0, 0],  # rank 1 has no trainable group: no backward there
    "micro-batches": [1, 1, 1, 1, 0],  # rank 0 runs three micro-batches, rank 1 one
    "out of memory": [1, 0, 1, 1, 0],
    "none trainable": [0, 0, 0, 0, 0],
}


def _model():
    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(conf).to(torch.float64)


def _batch(case: str):
    """The global batch: P groups of G rows, ragged completions, advantages and trainable groups."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (P * G, LP + LC), generator=gen)
    mask = torch.ones_like(ids)
    lengths = torch.randint(1, LC + 1, (P * G,), generator=gen)
    for row, n in enumerate(lengths.tolist()):
        mask[row, LP + n:] = 0
    totals = torch.rand((P, G), generator=gen, dtype=torch.float64).numpy()
    trainable = np.array(TRAINABLE[case], bool)
    return ids, mask, grpo.advantages(totals, trainable), trainable


def _rollouts(ids, mask, groups: slice) -> Rollouts:
    rows = slice(groups.start * G, groups.stop * G)
    n = groups.stop - groups.start
    return Rollouts(ids[rows], mask[rows], LP, [""] * (n * G), [{}] * (n * G), n, G, [""] * n)


def _config(case: str, rank: int) -> GRPOConfig:
    micro = 1 if case == "micro-batches" else 0  # one group per micro-batch (0: all at once)
    return GRPOConfig(micro_batch_groups=micro, micro_batch_mb=0, drop_untrainable=True, beta=0.0, lr=0.05,
                      max_grad_norm=0.0)


def _train(ranks: Ranks, case: str) -> list[np.ndarray]:
    ids, mask, adv, trainable = _batch(case)
    share = ranks.share(P)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    cfg = _config(case, ranks.rank)
    roll = _rollouts(ids, mask, share)
    calls = {"n": 0}

    def attempt(groups: int) -> dict:
        calls["n"] += 1
        if case == "out of memory" and ranks.rank == 1 and calls["n"] == 1:  # rank 1 alone, once
            real = grpo._micro_batch

            def fail(*a, **kw):
                grpo._micro_batch = real
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
            grpo._micro_batch = fail
        cfg.micro_batch_groups = groups
        return grpo.train_on(model, optimizer, roll, adv[share], trainable[share], cfg, world=ranks)
    for _ in range(2):  # two steps: Adam's state carries over
        out = out_of_memory.halving(attempt, max(1, share.stop - share.start), stage="training", knob="k",
                                    on_retry=lambda groups, error: None)
    return [p.detach().numpy().copy() for p in model.parameters()] + [np.array([out["rows"], calls["n"]])]


def _worker(rank: int, port: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    ranks = Ranks(rank, 2, rank, "gloo")
    try:  # every case in one job: starting two processes costs more than the cases
        for case in TRAINABLE:
            np.savez(os.path.join(out_dir, f"{case}-rank{rank}.npz"), *_train(ranks, case))
        Path(out_dir, f"diverged-rank{rank}.txt").write_text(_diverge(ranks, Path(out_dir)))
    finally:
        torch.distributed.destroy_process_group()


def _diverge(ranks: Ranks, out_dir: Path) -> str:
    """Two ranks' trainers, one of which takes a weight change the other never got: the next
    step boundary must fail both (rank 0 holds the store, as under torchrun)."""
    from grpo_core.runs.store import RunStore
    from grpo_core.tasks.loading import load_config
    from grpo_core.train.trainer import Trainer
    cfg = load_config(None, ["model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
                             "model.intermediate_size=32", "model.warm_start_steps=0", "log.progress=false"])
    store = RunStore.create("diverge", cfg.to_dict(), root=out_dir) if ranks.main else None
    ranks.broadcast(None)  # the store exists before rank 1 looks for its folder
    trainer = Trainer(cfg, store, log=lambda m: None, ranks=ranks, run_dir=out_dir / "diverge")
    trainer.poll_control()  # the same settings: no error
    if ranks.rank == 1:
        trainer.reward.set_weights({**trainer.reward.weights, "exact": 0.9})
    try:
        trainer.poll_control()
    except RuntimeError as error:
        return str(error)
    return "no error"



@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """Every case trained on two gloo processes; their results' folder."""
    out = tmp_path_factory.mktemp("ranks")
    # Forked, not spawned: the workers start with this process's imports (a spawned worker spends
    # its first seconds importing torch and transformers again).
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=2, join=True, start_method="fork")
    return out


def test_ranks_that_hold_different_settings_fail_at_the_next_step_boundary(two_ranks):
    for rank in (0, 1):
        text = (two_ranks / f"diverged-rank{rank}.txt").read_text()
        assert text.startswith("the ranks disagree on the settings after step 0") and "0.9" in text


@pytest.mark.parametrize("case", list(TRAINABLE))
def test_two_ranks_update_as_one_process(two_ranks, case):
    torch.set_num_threads(1)
    single = _train(SINGLE, case)
    ranks = [np.load(two_ranks / f"{case}-rank{r}.npz") for r in (0, 1)]
    ranks = [[f[f"arr_{i}"] for i in range(len(f.files))] for f in ranks]
    *params0, (rows0, calls0) = ranks[0]
    *params1, (rows1, calls1) = ranks[1]
    *ref, (rows, _) = single
    assert rows0 == rows1 == rows  # the rows trained, summed over ranks
    for a, b, r in zip(params0, params1, ref):
        np.testing.assert_array_equal(a, b)  # both ranks hold the same weights
        np.testing.assert_allclose(a, r, rtol=0, atol=1e-10)
    start = [p.detach().numpy() for p in _model().parameters()]
    moved = max(np.abs(a - b).max() for a, b in zip(ref, start))
    assert moved == 0 if case == "none trainable" else moved > 1e-3
    # out of memory: rank 1 ran out in the first step; both retried it with half the batch, together
    assert calls0 == calls1 == (3 if case == "out of memory" else 2)
