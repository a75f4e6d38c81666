"""The Opacus plugin's batched fetch (one indexing per tensor a batch) against torch's per-row path
(``TensorDataset.__getitem__`` a row, then ``default_collate``): the same batches under Opacus' Poisson
sampler, empty ones included, and the same trained models, so the speed-up cannot change an audit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus.data_loader import DPDataLoader  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpverify import conformance  # noqa: E402
from dpverify.contract import DPHyperparameters, SequenceRequest, TransformerArchitecture  # noqa: E402
from dpverify.registry import get_implementation  # noqa: E402
from dpverify_opacus import _training  # noqa: E402
from dpverify_opacus._dataloader import UserDataLoader  # noqa: E402
from dpverify_opacus._training import BatchFetchedTensors, Tweak, build_run  # noqa: E402


def per_row_loader(tensors, *, batch_sampler, generator) -> DataLoader:
    """What the plugin built before the batched fetch: a ``TensorDataset`` and torch's default collate."""
    return DataLoader(TensorDataset(*tensors), batch_sampler=batch_sampler, generator=generator)


def columns(num_records: int) -> tuple[torch.Tensor, ...]:
    """Float features, int64 labels, (n, 1 + H) packed tag targets and (n, T) token ids: every shape and
    dtype the classification and language tasks hand the loader."""
    rng = np.random.default_rng(0)
    return (
        torch.from_numpy(rng.standard_normal((num_records, 5)).astype(np.float32)),
        torch.from_numpy(rng.integers(0, 4, num_records)),
        torch.from_numpy(rng.integers(-1, 3, (num_records, 3))),
        torch.from_numpy(rng.integers(0, 50, (num_records, 7))),
    )


def poisson_batches(tensors, *, seed: int, passes: int) -> list:
    """``passes`` epochs of Opacus' ``DPDataLoader`` (what ``make_private`` makes of our loader) at q = 1/4."""
    loader = Tweak().data_loader(tensors, steps_per_epoch=4, generator=torch.Generator().manual_seed(seed))
    dp_loader = DPDataLoader.from_data_loader(loader)
    return [batch for _ in range(passes) for batch in dp_loader]


def assert_same_batches(fetched, reference) -> None:
    assert len(fetched) == len(reference)
    for batch, expected in zip(fetched, reference):
        assert type(batch) is type(expected) and len(batch) == len(expected)
        for column, expected_column in zip(batch, expected):
            assert column.dtype == expected_column.dtype and column.shape == expected_column.shape
            assert torch.equal(column, expected_column)


def test_poisson_batches_match_the_per_row_fetch_empty_ones_included():
    """Three records at q = 1/4: about four batches in ten are empty, the first of a loader for some
    seeds (Opacus makes zero tensors from ``dataset[0]``) and later ones for others (Opacus empties the
    first batch it kept); both paths must reach Opacus' handling the same way."""
    tensors = columns(3)
    first_empty = later_empty = False
    for seed in range(8):
        fetched = poisson_batches(tensors, seed=seed, passes=3)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_training, "batch_fetching_loader", per_row_loader)
            reference = poisson_batches(tensors, seed=seed, passes=3)
        assert_same_batches(fetched, reference)
        sizes = [len(batch[0]) for batch in reference]
        nonempty = [i for i, size in enumerate(sizes) if size]
        first_empty |= sizes[0] == 0
        later_empty |= bool(nonempty) and 0 in sizes[nonempty[0] :]
    assert first_empty and later_empty, "the seeds must reach both of Opacus' empty-batch paths"


def test_fetch_keeps_repeated_and_unsorted_indices():
    """A duplicating or shuffling sampler's batch is fetched row for row, in its order."""
    tensors = columns(6)
    indices = [4, 1, 1, 5, 0, 4]
    batch = BatchFetchedTensors(*tensors).__getitems__(indices)
    assert len(batch) == len(indices)
    for column, tensor in zip(batch.tensors, tensors):
        assert torch.equal(column, torch.stack([tensor[i] for i in indices]))


def claim_and_outputs(name: str, request) -> tuple:
    """The claim and the black box's outputs on the training records."""
    trained = get_implementation(name).train(request)
    if isinstance(request, SequenceRequest):
        return trained.claim, trained.token_log_probs(request.sequences)
    return trained.claim, trained.predict_log_proba(request.features)


def tiny_sequences() -> SequenceRequest:
    rng = np.random.default_rng(0)
    loss_mask = np.zeros((3, 6), dtype=bool)
    loss_mask[:, 3:] = True
    return SequenceRequest(
        sequences=rng.integers(0, 16, (3, 6)),
        loss_mask=loss_mask,
        vocab_size=16,
        architecture=TransformerArchitecture(width=8, heads=2, max_sequence_length=8),
        hyperparameters=DPHyperparameters(noise_multiplier=2.0, sampling_rate=0.25, epochs=5, learning_rate=1.0),
    )


# Two records at q = 1/4 over 5 epochs: 20 steps, more than half of them empty Poisson batches.
SPARSE = conformance.small_request(num_records=2, sampling_rate=0.25, epochs=5)


@pytest.mark.parametrize(
    ("name", "training_request"),
    [
        ("opacus-ghost", SPARSE),
        ("opacus-hooks", SPARSE),
        ("opacus-duplicated-rows", SPARSE),
        ("opacus-shuffled-batches", conformance.small_request()),
        ("opacus-lm", tiny_sequences()),
        ("opacus-lm-hooks", tiny_sequences()),
    ],
)
def test_training_is_bit_identical_to_the_per_row_fetch(name, training_request, monkeypatch):
    """The trained black box and the claim, to the bit, with the loader swapped for the per-row one."""
    claim, fetched = claim_and_outputs(name, training_request)
    monkeypatch.setattr(_training, "batch_fetching_loader", per_row_loader)
    per_row_claim, per_row = claim_and_outputs(name, training_request)
    assert claim == per_row_claim
    np.testing.assert_array_equal(fetched, per_row)


def test_the_tutorial_loader_stays_as_a_user_writes_it():
    """``opacus-dataloader`` models a user's ``DataLoader(dataset, batch_size=B)``: a plain TensorDataset and
    torch's default collate under Opacus' wrapper, not the plugin's batched fetch."""
    run = build_run(conformance.small_request(), name="opacus-dataloader", tweak=UserDataLoader(10))
    assert type(run.data_loader.dataset) is TensorDataset
    assert run.data_loader.collate_fn.wrapped_collator_fn is torch.utils.data.default_collate
