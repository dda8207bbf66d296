"""Shared fixtures for the engine tests: the tiny random Llama pair and a few real-looking prompts."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.models.tiny import make_tiny_pair

PROMPTS = (
    "def fibonacci(n):\n",
    "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
    "The quick brown fox",
)


@pytest.fixture(scope="session")
def tiny():
    """(target, draft, tokenizer); target head padded to 264 rows, draft 259, tokenizer 259."""
    torch.manual_seed(0)  # nothing should depend on it: make_tiny_pair seeds its own generator
    return make_tiny_pair(seed=0)


@pytest.fixture(scope="session")
def prompt_ids(tiny):
    _, _, tokenizer = tiny
    chats = [[{"role": "user", "content": text}] for text in PROMPTS]
    encoded = [
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        for chat in chats
    ]
    return [torch.tensor(ids) for ids in encoded]

