"""Language-model canaries (UniAud section 6, "Extending to language modeling"), framework-free.

The vocabulary is augmented with new tokens, so no canary competes with text the model knows, and each
canary is a prefix followed by a suffix:

- ``repeated`` (UniAud): one new token repeated ``prefix_length`` times, then another new token repeated
  ``suffix_length`` times. The comparison sequence keeps the prefix and repeats a fresh new token.
- ``new_token`` (the NewToken baseline of Panda et al. 2025): random tokens of the base vocabulary as
  prefix and random new tokens as suffix (one draw per position). The comparison is a fresh new-token
  suffix after the same prefix.

- ``dirac``: canary i owns two new tokens, its prefix token base + i and its suffix token base + m + i,
  which no other canary uses (2m new tokens a run), each repeated as in ``repeated``. In a transformer
  whose token embedding and LM head start at zero (``TransformerArchitecture(init="dirac")``) a canary's
  first gradient lies on its own suffix's head row only, as a Dirac canary's lies on its own weight column
  in softmax regression. The comparison is one base token, the same for every canary, which no canary
  trains: log p(own suffix) − log p(that token) cancels the softmax normaliser, the one part of the score
  the canaries share. Scored against non-members only (the inclusion design): the pair is not
  exchangeable.

In the drawn modes the fresh suffix token is drawn uniformly from the new tokens *other* than the trained
one at that position, so (trained, fresh) is an exchangeable pair before training (the paper's Property 1)
and the comparison can never coincide with the trained suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice, check_int

TokenCanaryMode = Literal["repeated", "new_token", "dirac"]
TOKEN_CANARY_MODES: tuple[str, ...] = ("repeated", "new_token", "dirac")
#: The modes whose (trained, fresh) suffixes are exchangeable, which the pair design needs.
EXCHANGEABLE_MODES: tuple[str, ...] = ("repeated", "new_token")


@dataclass(frozen=True, kw_only=True)
class TokenCanaryConfig:
    """m prefix → suffix canaries over a vocabulary of ``base_vocab_size`` + ``new_tokens`` tokens.

    New tokens are the ids [base_vocab_size, base_vocab_size + new_tokens). The paper finds the encoding
    degrades roughly as m / √new_tokens, so keep ``new_tokens`` of the order of m; ``dirac`` canaries
    need ``new_tokens >= 2m`` (:func:`check_dirac_token_room`)."""

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


def check_dirac_token_room(*, m: int, new_tokens: int) -> None:
    """Dirac token canaries own two new tokens each: a run of m of them needs ``new_tokens >= 2m``."""
    if new_tokens < 2 * m:
        raise ValueError(
            f"dirac token canaries own two new tokens each, so new_tokens must be >= 2 × the canaries of a run, "
            f"got new_tokens={new_tokens}, m={m}"
        )


def make_token_canaries(config: TokenCanaryConfig, *, rng: np.random.Generator) -> TokenCanaries:
    """Draw the canaries of ``config`` from ``rng`` (same seed, same canaries)."""
    m, base, new = config.m, config.base_vocab_size, config.new_tokens
    if config.mode == "dirac":
        return _dirac_token_canaries(config, rng=rng)
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


def _dirac_token_canaries(config: TokenCanaryConfig, *, rng: np.random.Generator) -> TokenCanaries:
    """Canary i: its own prefix token base + i, its own suffix token base + m + i, one shared base token
    drawn from ``rng`` as every canary's comparison."""
    check_dirac_token_room(m=config.m, new_tokens=config.new_tokens)
    owned = np.arange(config.m, dtype=np.int64)[:, None]
    shared = np.full((config.m, config.suffix_length), rng.integers(0, config.base_vocab_size), dtype=np.int64)
    return TokenCanaries(
        config=config,
        prefixes=np.repeat(config.base_vocab_size + owned, config.prefix_length, axis=1),
        suffixes=np.repeat(config.base_vocab_size + config.m + owned, config.suffix_length, axis=1),
        comparison_suffixes=shared,
    )


def suffix_log_likelihood(token_log_probs: np.ndarray, *, prefix_length: int) -> np.ndarray:
    """Σ over suffix positions of log p(x_t | x_<t), from the black box's (n, T − 1) output whose column
    t − 1 predicts position t."""
    return token_log_probs[:, prefix_length - 1 :].sum(axis=1)
