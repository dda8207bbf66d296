"""The model pair every command shares: one pair in memory at a time, loaded from a composed config.

``sweep`` (through :class:`~spectr_repro.runner.execute.Session`), ``replay`` and ``bias`` hold one
:class:`PairCache` each and ask it for the pair of every config they run::

    pairs = PairCache()
    pair = pairs.pair(run)                          # a settings.RunConfig's pair: loaded once, another released first
    examples = pairs.examples(run, pair.tokenizer)  # the run's prompts, read once per pair and prompt set
    pairs.release()                                 # memory freed (the GPU rule: release before loading another)

A config's pair is its ``model_pair`` node (or just its name) and its ``hardware`` (device, dtype,
``allow_offload``). Load failures (missing weights, unreachable hub, a bad pair config, a missing dataset)
become :class:`~spectr_repro.errors.ResourceError`; a pair that accelerate spread onto CPU or disk is refused
unless ``hardware.allow_offload`` is set, because timings of an offloaded pair compare nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from spectr_repro import models
from spectr_repro.data import load_examples
from spectr_repro.errors import ResourceError
from spectr_repro.settings import RunConfig


def echo_above_bars(message: str) -> None:
    """Print on stderr without breaking the progress bars."""
    tqdm.write(message, file=sys.stderr)


@dataclass
class PairCache:
    """The pair in memory and the prompt sets read with its tokenizer.

    ``echo`` says when a pair is loaded or released; ``on_load(name)`` is told before a pair is loaded (the
    runner's state file says "loading" while it happens).
    """

    echo: Callable[[str], None] = field(default=echo_above_bars)
    on_load: Callable[[str], None] = field(default=lambda name: None)
    _key: tuple | None = None  # the pair (config, hardware) this cache holds in memory
    _examples: dict[tuple, list] = field(default_factory=dict)

    def pair(self, run: RunConfig):
        """The config's pair (a ``models.ModelPair``): released and reloaded only when the pair changes;
        refused when offloaded."""
        wanted = run.model_pair
        key = pair_key(run)
        if self._key is not None and self._key != key:
            self.release()
        if models.loaded_pair_name() is None or self._key != key:
            self.echo(f"loading model pair {wanted}")
            self.on_load(wanted)
            self._key = key
        try:
            pair = models.load_pair(_pair_argument(run), device=run.hardware.device, dtype=run.hardware.dtype)
        except (ValueError, OSError, ImportError) as error:  # missing weights, unreachable hub, bad config
            raise ResourceError(f"cannot load model pair {wanted}: {error}") from error
        if pair.offloaded and not run.hardware.allow_offload:
            raise ResourceError(models.offload_message(pair))
        return pair

    def release(self) -> None:
        """Drop the pair in memory (and empty the CUDA cache); says so when one was loaded."""
        self._key = None
        name = models.release_pair()
        if name is not None:
            self.echo(f"released model pair {name} (memory freed before the next pair)")

    def examples(self, run: RunConfig, tokenizer, num_prompts: int | None = None) -> list:
        """The config's prompts (dataset, ``num_prompts`` (default the config's), seed), read once per pair and
        prompt set."""
        dataset, count = run.dataset_values, num_prompts or run.num_prompts
        key = (run.model_pair, repr(dataset), count, run.seed)
        if key not in self._examples:
            try:
                self._examples[key] = load_examples(dataset, count, seed=run.seed, tokenizer=tokenizer)
            except (ValueError, OSError, ImportError) as error:  # missing data folder or file
                raise ResourceError(f"cannot load dataset {run.dataset}: {error}") from error
        return self._examples[key]


def pair_key(run: RunConfig) -> tuple:
    """What fixes the models in memory: the pair's resolved config and the hardware (device, dtype)."""
    return (run.model_pair, repr(run.pair_values), repr(run.values["hardware"]))


def _pair_argument(run: RunConfig):
    """What models.load_pair receives: the pair's config (with its name) or just the name."""
    return run.named_pair_values if run.pair_values else run.model_pair


def pair_config_of(run: RunConfig) -> dict:
    """The cell's resolved model pair config (``models.pair_config``), named."""
    return models.pair_config(run.named_pair_values)


__all__ = ["PairCache", "echo_above_bars", "pair_config_of", "pair_key"]
