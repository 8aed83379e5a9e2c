"""GRPO Health: a GRPO trainer and a dashboard that shows, live, whether its training is healthy."""
