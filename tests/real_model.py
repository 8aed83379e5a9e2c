"""A real-architecture model for tests and benchmarks, built here because no weights can be
downloaded: a Qwen2 config at random init and a byte-level BPE tokenizer trained with
`tokenizers` on the demo task's text, with Qwen's chat special tokens and chat template and
two eos ids in the generation_config (as Qwen2.5 lists them). Saved as a Hugging Face folder
and loaded through `from_pretrained`, exactly as a hub model is; built once per size and
cached under the given root."""
from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(n: int = 4000, files: int = 400) -> list[str]:
    """Text the tokenizer learns its merges from: demo prompts and answers at every level, and
    the sources of Python's standard library (English and code: enough variety for a vocabulary
    of thousands of tokens; what the machine has, no download)."""
    import json as stdlib_module

    from grpo_core.tasks.demo import DemoTask
    out = []
    for level in (1, 2, 3, 4):
        for ex in DemoTask(level, seed=level).batch(n // 4):
            out.append(ex["prompt"] + " " + str(ex["answer"]))
    stdlib = sorted(Path(stdlib_module.__file__).parents[1].glob("*.py"))[:files]
    out += [f.read_text(encoding="utf-8", errors="replace") for f in stdlib]
    return out


def build(root: Path, vocab_size: int = 2048, hidden_size: int = 128, layers: int = 2, heads: int = 4,
          kv_heads: int = 2, intermediate_size: int = 352, seed: int = 0) -> Path:
    """The model folder (built on the first call for these sizes, then reused)."""
    key = f"qwen2-v{vocab_size}-h{hidden_size}-l{layers}-a{heads}-kv{kv_heads}-i{intermediate_size}-s{seed}"
    path = Path(root) / key
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE)
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "built.json").write_text(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))
    tmp.rename(path)
    return path
