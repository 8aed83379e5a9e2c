"""The binary planner: how likely a group of G binary rewards is to have both outcomes, and the smallest G that reaches a target.

From one pooled success rate (p_trainable_binary, min_group_size), or from per-prompt rates
shrunk toward it (beta_prior, prompt_flat_probabilities, flat_rates, prompt_flat_curve)."""
from __future__ import annotations

import math

import numpy as np


def p_trainable_binary(p, G):
    """Probability that a group of G binary rewards with success rate p is not all equal:
    1 - p^G - (1-p)^G. Broadcasts over arrays."""
    pa, ga = np.asarray(p, dtype=np.float64), np.asarray(G)
    if np.any(~np.isfinite(pa)) or np.any((pa < 0) | (pa > 1)):
        raise ValueError(f"success rate p must be in [0, 1], got {p!r}")
    if np.any(ga < 1) or np.any(ga != np.round(ga)):
        raise ValueError(f"group size G must be an integer >= 1, got {G!r}")
    out = np.clip(1.0 - pa ** ga - (1.0 - pa) ** ga, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def min_group_size(p: float, target: float, g_max: int = 256) -> int | None:
    """Smallest G >= 2 whose binary trainable probability reaches target; None if no G <= g_max does."""
    if not 0 < target <= 1:
        raise ValueError(f"target probability must be in (0, 1], got {target!r}")
    g = np.arange(2, max(int(g_max), 2) + 1)
    ok = np.flatnonzero(p_trainable_binary(p, g) >= target)
    return int(g[ok[0]]) if len(ok) else None


# ---- prompts differ: per-prompt success rates ----------------------------------------------------
# One pooled rate p predicts a flat share p^G + (1-p)^G; with per-prompt rates p_i the share is
# mean_i(p_i^G + (1-p_i)^G), which Jensen's inequality makes >= the pooled one (easy prompts are
# all solved, hard ones all failed). Each prompt's rate is estimated by empirical Bayes: a
# Beta(a, b) prior over the prompts' rates, its mean the pooled rate and its strength a + b the one
# that makes the observed counts most likely (beta-binomial marginal likelihood), so a prompt seen
# once is shrunk toward the pool rather than read as p = 0 or 1, and a run whose prompts really
# differ keeps a wide prior. A prompt's flat probability is then the beta-binomial predictive one,
# E[p^G + (1-p)^G] under its posterior, not the formula at a point estimate (which would itself
# under-predict, by the same inequality).
PRIOR_STRENGTHS = np.geomspace(0.05, 1e4, 81)  # the candidate a + b of the prompts' Beta prior


def _betaln(a, b) -> np.ndarray:
    lg = np.vectorize(math.lgamma, otypes=[np.float64])
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return lg(a) + lg(b) - lg(a + b)


def _counts(successes, trials) -> tuple[np.ndarray, np.ndarray]:
    s, n = np.asarray(successes, np.float64).ravel(), np.asarray(trials, np.float64).ravel()
    if s.shape != n.shape or np.any(n < 0) or np.any(s < 0) or np.any(s > n) or not np.all(np.isfinite(s + n)):
        raise ValueError("per-prompt counts need 0 <= successes <= trials, one pair per prompt")
    keep = n > 0
    return s[keep], n[keep]


def pooled_rate(successes, trials) -> float | None:
    """Successes / trials over every prompt; None with no trials."""
    s, n = _counts(successes, trials)
    return float(s.sum() / n.sum()) if n.sum() > 0 else None


def beta_prior(successes, trials) -> tuple[float, float] | None:
    """Beta(a, b) over the prompts' success rates: mean the pooled rate, strength a + b the grid
    value of the largest beta-binomial marginal likelihood. None when the pooled rate is 0 or 1
    (every prompt the same: nothing to spread) or there are no trials."""
    s, n = _counts(successes, trials)
    p = pooled_rate(s, n)
    if p is None or p <= 0.0 or p >= 1.0:
        return None
    pairs, times = np.unique(np.stack([s, n], axis=1), axis=0, return_counts=True)  # prompts share counts
    s, n = pairs[:, 0], pairs[:, 1]
    a, b = p * PRIOR_STRENGTHS[:, None], (1.0 - p) * PRIOR_STRENGTHS[:, None]  # [K, 1] against [1, pairs]
    loglik = ((_betaln(s[None, :] + a, (n - s)[None, :] + b) - _betaln(a, b)) * times[None, :]).sum(axis=1)
    k = PRIOR_STRENGTHS[int(np.argmax(loglik))]
    return float(p * k), float((1.0 - p) * k)


def flat_probability_beta(a, b, G) -> np.ndarray | float:
    """P(a group of G binary rewards is all equal) when the success rate is Beta(a, b):
    B(a+G, b)/B(a, b) + B(a, b+G)/B(a, b). Broadcasts."""
    _check_g(G)
    a, b, g = np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(G, np.float64)
    base = _betaln(a, b)
    out = np.clip(np.exp(_betaln(a + g, b) - base) + np.exp(_betaln(a, b + g) - base), 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def _check_g(G):
    ga = np.asarray(G)
    if np.any(ga < 1) or np.any(ga != np.round(ga)):
        raise ValueError(f"group size G must be an integer >= 1, got {G!r}")


def prompt_flat_probabilities(successes, trials, G, prior: tuple[float, float] | None = None) -> np.ndarray:
    """[prompts] each prompt's predicted flat probability at group size G (an int), from its own
    counts shrunk toward the prompts' prior (beta_prior of these counts unless given). Prompts
    with no trials get the prior's. With no spread (prior None) every prompt gets the pooled formula."""
    _check_g(G)
    s, n = np.asarray(successes, np.float64).ravel(), np.asarray(trials, np.float64).ravel()
    _counts(s, n)  # validates
    prior = beta_prior(s, n) if prior is None else prior
    if prior is None:
        p = pooled_rate(s, n)
        return np.full(len(s), 1.0 if p is None else 1.0 - float(p_trainable_binary(p, G)))
    a, b = prior
    return np.asarray(flat_probability_beta(a + s, b + n - s, G), dtype=np.float64)


def flat_rates(successes, trials, G, prior: tuple[float, float] | None = None) -> dict:
    """The flat-group share at group size G predicted two ways from per-prompt counts, each prompt
    weighted once: "pooled" (p^G + (1-p)^G at the pooled rate) and "per_prompt" (the mean of
    prompt_flat_probabilities). None where there are no trials."""
    p = pooled_rate(successes, trials)
    if p is None:
        return {"pooled": None, "per_prompt": None, "p": None, "prior": None}
    prior = beta_prior(successes, trials) if prior is None else prior
    return {"pooled": 1.0 - float(p_trainable_binary(p, G)), "p": p, "prior": prior,
            "per_prompt": float(prompt_flat_probabilities(successes, trials, G, prior).mean())}


def prompt_flat_curve(successes, trials, gs, prior: tuple[float, float] | None = None) -> np.ndarray:
    """[len(gs)] the per-prompt predicted flat share (each prompt once) at each group size in gs."""
    _check_g(gs)
    s, n = np.asarray(successes, np.float64).ravel(), np.asarray(trials, np.float64).ravel()
    _counts(s, n)
    prior = beta_prior(s, n) if prior is None else prior
    g = np.asarray(gs, np.float64).ravel()
    if prior is None:
        p = pooled_rate(s, n)
        return np.ones(len(g)) if p is None else 1.0 - np.asarray(p_trainable_binary(p, g.astype(int)), np.float64)
    a, b = prior
    return np.asarray(flat_probability_beta((a + s)[None, :], (b + n - s)[None, :], g[:, None])).mean(axis=1)
