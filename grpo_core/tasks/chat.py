"""Prompts as the model reads them: a task's prompt rendered with the tokenizer's chat template.

A task's `prompt` (a string, or a list of chat messages {"role", "content"}) is rendered as
TRL's GRPOTrainer renders conversational data (`apply_chat_template(...,
add_generation_prompt=True)`).

task.chat_template: auto renders through the tokenizer's template when it has one (an
instruct model needs its template) and passes a string through when it has none (the built-in
model, a base model); none never renders. task.system_prompt comes first: as a system message
through a template, as a plain first paragraph without one. A rendered prompt already holds
the model's special tokens, so it is tokenized without adding them again (a second BOS).
The rendered text is what the store keeps for each prompt."""
from __future__ import annotations

from grpo_core.errors import ConfigError

CHAT_TEMPLATES = ("auto", "none")


def messages_of(prompt, system_prompt: str = "") -> list[dict]:
    """A prompt as chat messages, the system prompt first."""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt and not (turns and turns[0].get("role") == "system"):
        turns.insert(0, {"role": "system", "content": system_prompt})
    return turns


def check_messages(where: str, prompt) -> None:
    """A list prompt must be chat messages: objects with a string role and content."""
    ok = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if not ok:
        raise ConfigError(f"{where}: field 'prompt' must be a string or a list of messages "
                          '[{"role": "user", "content": "..."}], got ' + repr(prompt)[:60])


def uses_template(tokenizer, chat_template: str) -> bool:
    return chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer, prompt, chat_template: str = "auto", system_prompt: str = "") -> str:
    """The text the model is prompted with."""
    if uses_template(tokenizer, chat_template):
        return tokenizer.apply_chat_template(messages_of(prompt, system_prompt), tokenize=False,
                                             add_generation_prompt=True)
    if not isinstance(prompt, str):
        why = "task.chat_template is none" if chat_template == "none" else "the tokenizer has no chat template"
        raise ConfigError(f"a prompt is a list of chat messages but {why}: give prompts as strings, or use "
                          "task.chat_template=auto with a model whose tokenizer has a chat template")
    return f"{system_prompt}\n\n{prompt}" if system_prompt else prompt
