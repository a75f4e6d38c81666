"""The conformance suite for language-model trainers: every bundled correct LM implementation passes it, and
a trainer that breaks the contract in one way fails the check for that way, with a message naming the fix.
The broken trainers wrap Opacus' real one and change one thing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpverify import conformance, language_conformance
from dpverify.contract import ImplementationInfo, LanguageImplementation
from dpverify.registry import registered_implementations

CORRECT_LANGUAGE = [i for i in registered_implementations() if i.info.task == "language" and i.info.expected == "private"]


def _available(impl):
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return impl


@pytest.mark.parametrize("impl", CORRECT_LANGUAGE, ids=lambda impl: impl.info.name)
def test_every_correct_language_implementation_conforms(impl):
    language_conformance.run_language_conformance(_available(impl))


class _Changed(LanguageImplementation):
    """Opacus' LM trainer with one thing changed: the request it trains on, or the black box it returns."""

    def __init__(self, *, request_change=None, output_change=None):
        from dpverify.registry import get_implementation

        self.inner = _available(get_implementation("opacus-lm"))
        self.info = ImplementationInfo(name="changed-lm", library="opacus", task="language")
        self.request_change, self.output_change = request_change, output_change

    def train(self, request):
        trained = self.inner.train(self.request_change(request) if self.request_change else request)
        if self.output_change is None:
            return trained
        return dataclasses.replace(trained, token_log_probs=lambda s: self.output_change(trained.token_log_probs(s)))


def test_a_trainer_of_its_own_randomly_initialised_model_fails_the_dirac_check():
    def random_init(request):
        return dataclasses.replace(request, architecture=dataclasses.replace(request.architecture, init="random"))

    with pytest.raises(AssertionError, match="changed-lm: after one noiseless step.*starts at zero with init='dirac'"):
        language_conformance.check_dirac_transformer(
            _Changed(request_change=random_init), language_conformance.small_sequence_request()
        )


def test_outputs_that_are_not_log_probabilities_fail_the_output_contract():
    shifted = _Changed(output_change=lambda log_probs: log_probs - 0.1)  # each ≤ 0, but they sum to e^-0.1
    with pytest.raises(AssertionError, match="changed-lm: after context .* sum to exp\\(-0.1"):
        language_conformance.check_sequence_output_contract(shifted, language_conformance.small_sequence_request())


def test_each_suite_refuses_the_other_task_naming_the_right_one():
    with pytest.raises(ValueError, match="trains a language model; these checks cover the classification contract.*run_language_conformance"):
        conformance.run_conformance(CORRECT_LANGUAGE[0])
    classifier = next(i for i in registered_implementations() if i.info.task == "classification")
    with pytest.raises(ValueError, match="use dpverify.conformance.run_conformance"):
        language_conformance.run_language_conformance(classifier)


def test_the_dirac_check_needs_the_dirac_init_and_unseen_tokens():
    request = language_conformance.small_sequence_request()
    random = dataclasses.replace(request, architecture=dataclasses.replace(request.architecture, init="random"))
    with pytest.raises(ValueError, match="init='dirac'"):
        language_conformance.check_dirac_transformer(CORRECT_LANGUAGE[0], random)
    every_token = dataclasses.replace(request, sequences=np.arange(32, dtype=np.int64).reshape(8, 4), loss_mask=request.loss_mask[:8])
    with pytest.raises(ValueError, match="two tokens that no sequence contains"):
        language_conformance.check_dirac_transformer(CORRECT_LANGUAGE[0], every_token)
