"""Language-model canaries (UniAud section 6, "Extending to language modeling"), framework-free.

The vocabulary is augmented with new tokens, so no canary competes with text the model knows, and each
canary is a prefix followed by a suffix:

- ``repeated`` (UniAud): one new token repeated ``prefix_length`` times, then another new token repeated
  ``suffix_length`` times. The comparison sequence keeps the prefix and repeats a fresh new token.
- ``new_token`` (the NewToken baseline of Panda et al. 2025): random tokens of the base vocabulary as
  prefix and random new tokens as suffix (one draw per position). The comparison is a fresh new-token
  suffix after the same prefix.

The fresh suffix token is drawn uniformly from the new tokens *other* than the trained one at that
position, so (trained, fresh) is an exchangeable pair before training (the paper's Property 1) and the
comparison can never coincide with the trained suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice, check_int

TokenCanaryMode = Literal["repeated", "new_token"]
TOKEN_CANARY_MODES: tuple[str, ...] = ("repeated", "new_token")


@dataclass(frozen=True, kw_only=True)
class TokenCanaryConfig:
    """m prefix → suffix canaries over a vocabulary of ``base_vocab_size`` + ``new_tokens`` tokens.

    New tokens are the ids [base_vocab_size, base_vocab_size + new_tokens). The paper finds the encoding
    degrades roughly as m / √new_tokens, so keep ``new_tokens`` of the order of m."""

    m: int = 1000
    prefix_length: int = 4
    suffix_length: int = 4
    base_vocab_size: int = 100
    new_tokens: int = 1000
    mode: TokenCanaryMode = "repeated"

    def __post_init__(self) -> None:
        check_int("m", self.m, low=1)
        check_int("prefix_length", self.prefix_length, low=1)
        check_int("suffix_length", self.suffix_length, low=1)
        check_int("base_vocab_size", self.base_vocab_size, low=1)
        check_int("new_tokens", self.new_tokens, low=2)
        check_choice("mode", self.mode, TOKEN_CANARY_MODES)

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + self.new_tokens

    @property
    def sequence_length(self) -> int:
        return self.prefix_length + self.suffix_length


@dataclass(frozen=True, kw_only=True, eq=False)
class TokenCanaries:
    """Prefixes (m, prefix_length), trained suffixes and fresh comparison suffixes (m, suffix_length)."""

    config: TokenCanaryConfig
    prefixes: np.ndarray
    suffixes: np.ndarray
    comparison_suffixes: np.ndarray

    @property
    def m(self) -> int:
        return int(self.prefixes.shape[0])

    def sequences(self, suffixes: np.ndarray) -> np.ndarray:
        """Each prefix followed by the given suffix, (m, T) int64."""
        return np.concatenate([self.prefixes, suffixes], axis=1)

    def loss_mask(self) -> np.ndarray:
        """True on the suffix positions: the targets the model is trained and scored on."""
        mask = np.zeros((self.m, self.config.sequence_length), dtype=bool)
        mask[:, self.config.prefix_length :] = True
        return mask


def make_token_canaries(config: TokenCanaryConfig, *, rng: np.random.Generator) -> TokenCanaries:
    """Draw the canaries of ``config`` from ``rng`` (same seed, same canaries)."""
    m, base, new = config.m, config.base_vocab_size, config.new_tokens
    if config.mode == "repeated":
        prefixes = np.repeat(base + rng.integers(0, new, size=(m, 1)), config.prefix_length, axis=1)
        suffix_shape = (m, 1)
    else:
        prefixes = rng.integers(0, base, size=(m, config.prefix_length))
        suffix_shape = (m, config.suffix_length)
    suffixes = rng.integers(0, new, size=suffix_shape)
    # Uniform over the other new - 1 tokens: a shift by 1..new-1 modulo new.
    comparison = (suffixes + rng.integers(1, new, size=suffix_shape)) % new
    width = config.suffix_length // suffix_shape[1]
    return TokenCanaries(
        config=config,
        prefixes=prefixes.astype(np.int64),
        suffixes=np.repeat(base + suffixes, width, axis=1).astype(np.int64),
        comparison_suffixes=np.repeat(base + comparison, width, axis=1).astype(np.int64),
    )


def suffix_log_likelihood(token_log_probs: np.ndarray, *, prefix_length: int) -> np.ndarray:
    """Σ over suffix positions of log p(x_t | x_<t), from the black box's (n, T − 1) output whose column
    t − 1 predicts position t."""
    return token_log_probs[:, prefix_length - 1 :].sum(axis=1)
