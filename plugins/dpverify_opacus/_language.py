"""Opacus 1.6 training a small causal transformer on token canaries (the language-model contract).

The model is built from ``nn.Embedding``, ``nn.LayerNorm`` and ``nn.Linear`` only (attention is a
parameter-free ``scaled_dot_product_attention`` between them), so Opacus computes per-sample gradients
with its own layers in both ``grad_sample_mode``s. One sequence is one record: Opacus' Poisson sampler
draws sequences, and each sequence's gradient (the mean over its suffix positions) is one clipped row.
Training reuses the classification path's pieces (:class:`~._training.OpacusRun`, ``backward_batch``,
the calibration and the claim) and its buggy variants: any :class:`~._training.Tweak` gets the language
loss mixed in, so ``opacus-lm-no-noise`` is the same mutation of Opacus' ``DPOptimizer.add_noise`` as
``opacus-no-noise``. Imports torch and opacus.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dpverify.contract import SequenceModel, SequenceRequest, TransformerArchitecture
from dpverify_opacus._training import OpacusRun, Task, Tweak, build_run, mix_into, run_steps, trained_module

IGNORED_TARGET = -100  # nn.CrossEntropyLoss' default ignore_index: prefix positions add nothing to the loss


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        q, k, v = self.qkv(hidden).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attention(self.attention_norm(hidden))
        return hidden + self.mlp(self.mlp_norm(hidden))


class CausalTransformer(nn.Module):
    """Token + position embeddings, ``layers`` blocks, a final LayerNorm and an LM head: (n, T) → (n, T, V)."""

    def __init__(self, vocab_size: int, architecture: TransformerArchitecture):
        super().__init__()
        width = architecture.width
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(architecture.max_sequence_length, width)
        self.blocks = nn.Sequential(*(Block(width, architecture.heads) for _ in range(architecture.layers)))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Positions get a batch axis so Opacus sees one row per sequence in the position embedding too.
        positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
        hidden = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.final_norm(self.blocks(hidden)))


def build_transformer(request: SequenceRequest, *, seed: int, device: torch.device) -> CausalTransformer:
    """The designated transformer with torch's default init drawn from ``seed`` (global RNG left alone);
    ``init="dirac"`` then zeroes the token embedding and the LM head."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CausalTransformer(request.vocab_size, request.architecture)
    if request.architecture.init == "dirac":
        with torch.no_grad():
            for param in (model.token_embedding.weight, model.head.weight, model.head.bias):
                param.zero_()
    return model.to(device)


def next_token_tensors(request: SequenceRequest) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``: x_<T and x_>0, with the targets outside the loss mask set to ignored."""
    targets = np.where(request.loss_mask[:, 1:], request.sequences[:, 1:], IGNORED_TARGET)
    return torch.from_numpy(np.ascontiguousarray(request.sequences[:, :-1])), torch.from_numpy(targets)


def language_loss(base: type) -> type:
    class LanguageLoss(base):
        """The tweak's changes, with the loss of a causal LM: per sequence, the mean cross-entropy over its
        target positions (ghost mode reshapes per Opacus' ``shape=`` convention for sequence models)."""

        def loss(self, run: OpacusRun, inputs: torch.Tensor, targets: torch.Tensor):
            logits = run.module(inputs)
            if run.grad_sample_mode == "ghost":
                return run.criterion(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), shape=logits.shape)
            return run.criterion(logits.transpose(1, 2), targets)  # every sequence has as many targets

    return LanguageLoss


#: The causal transformer on a :class:`SequenceRequest`: next-token targets, suffix positions only.
LANGUAGE = Task(
    build_model=lambda request, seed, device: build_transformer(request, seed=seed, device=device),
    tensors=next_token_tensors,
    criterion=lambda request: nn.CrossEntropyLoss(ignore_index=IGNORED_TARGET),
)


def train_opacus_language(
    request: SequenceRequest, *, name: str, grad_sample_mode: str = "ghost", tweak: Tweak | None = None
) -> SequenceModel:
    """Train the designated transformer with Opacus' ``PrivacyEngine`` (the classification path's engine,
    sampling, noise and accounting, with the language loss mixed into ``tweak``); return the black box
    and the claim."""
    tweak = mix_into(tweak or Tweak(), language_loss)
    run = build_run(request, name=name, grad_sample_mode=grad_sample_mode, tweak=tweak, task=LANGUAGE)  # type: ignore[arg-type]
    claim = run_steps(run)
    return SequenceModel(token_log_probs=make_token_log_probs(trained_module(run), run.device), claim=claim, device=run.device.type)


def make_token_log_probs(
    model: nn.Module, device: torch.device, *, batch_size: int = 2048
) -> Callable[[np.ndarray], np.ndarray]:
    """The black box: (n, T) int64 sequences → (n, T − 1) float64 log p(x_{t+1} | x_≤t), in eval mode,
    log-softmax in float64 so that differences of log-probabilities keep their precision."""

    def token_log_probs(sequences: np.ndarray) -> np.ndarray:
        sequences = np.asarray(sequences, dtype=np.int64)
        if sequences.ndim != 2 or sequences.shape[1] < 2:
            raise ValueError(f"sequences must be a 2-D array of at least 2 tokens, got shape {sequences.shape}")
        model.eval()
        outputs = [np.zeros((0, sequences.shape[1] - 1))]
        with torch.no_grad():
            for start in range(0, sequences.shape[0], batch_size):
                chunk = torch.from_numpy(sequences[start : start + batch_size]).to(device)
                log_probs = torch.log_softmax(model(chunk[:, :-1]).double(), dim=-1)
                outputs.append(log_probs.gather(-1, chunk[:, 1:, None])[..., 0].cpu().numpy())
        return np.concatenate(outputs, axis=0)

    return token_log_probs
