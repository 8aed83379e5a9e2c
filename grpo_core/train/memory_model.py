"""How much memory a training step needs, by part, from the model's sizes and the step's knobs.

So the knobs (micro-batch, log-prob chunk, checkpointing, LoRA, sampling batch) can be picked
before a run instead of found by running out of memory, and so docs/trainer.md's "what fits where"
table can be regenerated (bench/memory_table.py). Checked against CPU measurements of the real code path
(tests/test_memory_model.py) and, where a GPU is lent, against torch.cuda.max_memory_allocated
(bench/gpu_check.py reports both).

What it counts is what the trainer holds (models.load_policy, native_sampling.rollout, grpo.train_on):
- the weights in fp32 (the master copy the optimizer updates), whatever the compute dtype;
- the gradients and AdamW's two moments, fp32, of what trains: every weight, or the adapters;
- under bf16/fp16 autocast, a 16-bit copy of every weight matrix (autocast caches the casts of
  trainable weights; a frozen base's casts are saved for backward instead);
- one micro-batch's saved activations, per layer and token as a Qwen2/Llama decoder layer keeps
  them: the residual stream and the RMSNorms in fp32 even under autocast (the embedding output
  is fp32), the matmul inputs and the MLP in the compute dtype, keys and values repeated to every
  head (GQA with a padding mask). Without checkpointing each group's prompt is forwarded once
  and its keys and values copied to the group's rows; with checkpointing every row forwards its
  whole sequence, each layer keeps its input and one layer is recomputed at a time;
- the log-prob chunk's working set: about five fp32 [tokens, vocab] tensors of one chunk (logits,
  log-softmax, the entropy's temporaries), and the LM head's weight gradient as it accumulates;
- sampling: the KV cache of the rows sampled at once (keys in fp32: RoPE's fp32 cos/sin promote
  them) and their [rows, vocab] logits;
- the optimizer step's temporary: foreach AdamW (CUDA's default) one fp32 copy of what trains.
The peak is the largest of training, the optimizer step and sampling. Gradients count as held
throughout (from the previous step while sampling, from the first micro-batch while training):
an upper bound for a one-micro-batch step, exact from the second micro-batch on."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GIB = 2 ** 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
LOGIT_COPIES = 5.25  # logits, log-softmax, exp, the masked copy, their product, the p == 0 mask (1 byte)
SAMPLING_LOGIT_COPIES = 4  # the step's logits buffer, a fresh float copy, the softmax, the filtered scores


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's sizes (Qwen2 / Llama family)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True  # the LM head is the embedding matrix
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v; Llama none

    @property
    def kv(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def layer_parameters(self) -> int:
        h, kv, i = self.hidden, self.kv, self.intermediate
        return 2 * h * h + 2 * h * kv + 3 * h * i + (h + 2 * kv if self.qkv_bias else 0) + 2 * h

    def parameters(self) -> int:
        return self.layers * self.layer_parameters() + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def lora_parameters(self, rank: int) -> int:
        """Adapters on every linear layer of the decoder (peft's all-linear: not the LM head)."""
        h, kv, i = self.hidden, self.kv, self.intermediate
        return self.layers * rank * (2 * h + 2 * (h + kv) + 2 * h + 2 * (h + i) + (i + h))

    @classmethod
    def from_config(cls, config) -> "Architecture":
        """From a Hugging Face config (Qwen2Config, LlamaConfig, ...)."""
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
                   heads=c.num_attention_heads, kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                   vocab=c.vocab_size, tied=bool(getattr(c, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(c, "attention_bias", c.model_type == "qwen2")))


# Qwen2.5's published sizes (the models' config.json): what people post-train with GRPO.
QWEN2_5 = {
    "0.5B": Architecture(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936),
    "1.5B": Architecture(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936),
    "3B": Architecture(layers=36, hidden=2048, intermediate=11008, heads=16, kv_heads=2, vocab=151936),
    "7B": Architecture(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064, tied=False),
}


@dataclass(frozen=True)
class Step:
    """One step's shape and the knobs that set its memory (grpo.* and model.* of the config)."""
    rows: int  # rows per forward/backward micro-batch: grpo.micro_batch_groups x grpo.group_size
    prompt_tokens: int
    completion_tokens: int
    group_size: int = 8
    sample_rows: int | None = None  # rows sampled at once (grpo.sample_batch_groups x G); None = rows
    compute_dtype: str = "bfloat16"  # model.dtype (float32 on CPU)
    lora_rank: int = 0
    gradient_checkpointing: bool = False
    logit_chunk_mb: float = 256.0
    device: str = "cuda"  # cuda: foreach AdamW (a temporary copy of what trains); cpu: per tensor


@dataclass(frozen=True)
class Estimate:
    """Bytes, by part. `peak` is the step's high-water mark."""
    weights: float
    grads: float
    optimizer: float
    autocast_weights: float
    activations: float
    logprob_chunk: float
    optimizer_step: float
    sampling: float

    @property
    def held(self) -> float:
        """What stays between steps: weights, gradients, optimizer state."""
        return self.weights + self.grads + self.optimizer

    @property
    def train_peak(self) -> float:
        return self.held + self.autocast_weights + self.activations + self.logprob_chunk

    @property
    def peak(self) -> float:
        return max(self.train_peak, self.held + self.optimizer_step, self.held + self.sampling)

    def gib(self) -> dict:
        parts = {f.name: getattr(self, f.name) / GIB for f in dataclasses.fields(self)}
        return {**parts, "train_peak": self.train_peak / GIB, "peak": self.peak / GIB}


def layer_bytes(arch: Architecture, cbytes: int, lora: bool) -> tuple[float, float]:
    """(bytes per token forwarded, bytes per token attended) one decoder layer saves for backward.
    The second part is the keys and values repeated to every head, over each row's whole
    sequence (the prompt's too, when it was forwarded once per group)."""
    h, i = arch.hidden, arch.intermediate
    norms = 2 * (3 * h * 4 + 4)  # each RMSNorm: input, normalized, scaled output (fp32), 1/rms
    casts = 5 * h * cbytes if cbytes < 4 else 0  # autocast's copies of the norm outputs for q, k, v, gate, up
    if lora and cbytes < 4:
        casts *= 2  # the adapter casts its input apart from the frozen base layer
    attention = 3 * h * cbytes + arch.heads * 4  # query, output, its reshaped copy; log-sum-exp
    mlp = 4 * i * cbytes  # gate, up, silu(gate), their product
    return norms + casts + attention + mlp, 2 * h * cbytes


def tokens(step: Step) -> tuple[int, int, bool]:
    """(tokens forwarded, tokens attended, prompt shared) by one micro-batch: a group's prompt
    goes through the model once unless checkpointing (no KV cache in train mode) is on."""
    full = step.prompt_tokens + step.completion_tokens
    shared = step.group_size > 1 and step.prompt_tokens > 0 and not step.gradient_checkpointing
    groups = max(1, step.rows // step.group_size)
    forwarded = groups * step.prompt_tokens + step.rows * step.completion_tokens if shared else step.rows * full
    attended = step.rows * full + (groups * step.prompt_tokens if shared else 0)
    return forwarded, attended, shared


def activation_bytes(arch: Architecture, step: Step) -> float:
    """One micro-batch's activations at the start of its backward, the log-prob chunk apart."""
    cbytes = DTYPE_BYTES[step.compute_dtype]
    per_token, per_attended = layer_bytes(arch, cbytes, step.lora_rank > 0)
    forwarded, attended, shared = tokens(step)
    full = step.prompt_tokens + step.completion_tokens
    one_layer = forwarded * per_token + attended * per_attended
    mask = step.rows * step.completion_tokens * full * 4 if shared else step.rows * full * full * 4
    rope = forwarded * (arch.hidden // arch.heads) * 2 * 4  # cos and sin, shared by the layers
    final = forwarded * 3 * arch.hidden * 4 + step.rows * step.completion_tokens * arch.hidden * 4  # final norm, its completion rows
    if step.gradient_checkpointing:  # each layer's input (the fp32 residual); the final norm's are freed before
        return arch.layers * forwarded * arch.hidden * 4 + mask + rope + max(one_layer, final)  # a layer is recomputed
    return arch.layers * one_layer + mask + rope + final


def chunk_tokens(chunk_mb: float, vocab: int) -> int | None:
    """grpo.chunk_tokens: completion tokens per log-prob chunk (None: all at once)."""
    return max(1, int(chunk_mb * 2 ** 20 // (4 * vocab))) if chunk_mb > 0 else None


def logprob_chunk_bytes(arch: Architecture, step: Step) -> float:
    """The log-prob working set: one chunk's fp32 [tokens, vocab] tensors, and the LM head's
    weight gradient (the embedding's, when tied) as it accumulates, when the head trains."""
    cbytes = DTYPE_BYTES[step.compute_dtype]
    completion = step.rows * step.completion_tokens
    size = chunk_tokens(step.logit_chunk_mb, arch.vocab)
    n = min(completion, size) if size else completion
    per_token = arch.vocab * (LOGIT_COPIES * 4 + (cbytes if cbytes < 4 else 0))  # + the head's 16-bit output
    head_grad = 0 if step.lora_rank else arch.vocab * arch.hidden * (4 + (cbytes if cbytes < 4 else 0))
    return n * per_token + head_grad


def sampling_bytes(arch: Architecture, step: Step, trained: int) -> float:
    """Sampling's own memory: the KV cache (keys fp32, values in the compute dtype; one layer's
    copy as it grows), the rows' logits, the prompt prefill, and autocast's 16-bit weights."""
    cbytes = DTYPE_BYTES[step.compute_dtype]
    rows = step.sample_rows or step.rows
    prompts = max(1, rows // step.group_size)
    full = step.prompt_tokens + step.completion_tokens
    cache = rows * full * arch.kv * (4 + cbytes) * (arch.layers + 1)
    logits = rows * arch.vocab * 4 * SAMPLING_LOGIT_COPIES
    prefill = prompts * step.prompt_tokens * (4 * arch.hidden * 4 + 3 * arch.intermediate * cbytes)
    cast = 2 * trained if cbytes < 4 and not step.lora_rank else 0  # autocast's cache of trainable weights
    return cache + logits + prefill + cast


def estimate(arch: Architecture, step: Step) -> Estimate:
    """The step's memory by part (bytes); `.peak` is what must fit on the device."""
    total = arch.parameters()
    trained = arch.lora_parameters(step.lora_rank) if step.lora_rank else total
    cbytes = DTYPE_BYTES[step.compute_dtype]
    matrices = total - arch.layers * (2 * arch.hidden + (arch.hidden + 2 * arch.kv if arch.qkv_bias else 0))
    if step.lora_rank and step.gradient_checkpointing:  # frozen casts are saved per layer: one layer's at a time
        matrices = arch.layer_parameters() + arch.vocab * arch.hidden
    autocast_weights = 2 * matrices if cbytes < 4 else 0
    largest = max(arch.vocab * arch.hidden, arch.hidden * arch.intermediate) if not step.lora_rank else 0
    step_temp = 4 * trained if step.device == "cuda" else 4 * largest
    return Estimate(weights=4 * total, grads=4 * trained, optimizer=8 * trained, autocast_weights=autocast_weights,
                    activations=activation_bytes(arch, step), logprob_chunk=logprob_chunk_bytes(arch, step),
                    optimizer_step=step_temp, sampling=sampling_bytes(arch, step, trained))


def largest_rows(arch: Architecture, step: Step, memory_gib: float, most: int = 64) -> int:
    """The most rows per micro-batch (whole groups, up to `most`) whose peak fits in memory_gib
    (sampling the same rows at once); 0 when even one group does not fit."""
    best = 0
    for rows in range(step.group_size, most + 1, step.group_size):
        if estimate(arch, dataclasses.replace(step, rows=rows)).peak / GIB > memory_gib:
            break
        best = rows
    return best
