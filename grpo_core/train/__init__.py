"""The trainer process: the GRPO step, models, checkpoints, evaluation. The one wing that imports torch."""
