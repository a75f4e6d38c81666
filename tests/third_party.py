"""A third party's DP-SGD, as a user would write one beside dpverify: its own loop in torch, Poisson
batches, per-record clipping by hand, with the noisy sum divided by a normaliser of its choice, each
step's parameters handed to the auditor as the README shows. Two of the normalisers are the bugs a new user
found in such code: dividing by q·N of the private dataset, and by the realised batch size; and
``batches="shuffled"`` is the one every DP library ships: fixed-size batches of a shuffled dataset (a
data loader's, the last one short) with the Poisson accountant's ε. Imports torch only when it trains."""

from __future__ import annotations

from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest


def hand_over(request: TrainingRequest, step: int, model) -> None:
    """Every released update, as the README's trainer hands it over: the parameters after ``step``."""
    if request.observe_update is not None:
        request.observe_update(step, tuple(p.detach().numpy().copy() for p in model.parameters()))

#: What the noisy sum is divided by: the auditor's designated normaliser (correct), q·N of the dataset it
#: was handed (leaks N), or the sampled batch's size (leaks the batch).
NORMALISERS = ("designated", "dataset", "realised")
#: How batches are drawn: Poisson sampling at q (what the accountant assumes), or a shuffled dataset cut
#: into 1/q batches of ⌈N·q⌉ each epoch.
BATCHES = ("poisson", "shuffled")


class ThirdPartyDPSGD(Implementation):
    def __init__(self, name: str, normaliser: str, *, batches: str = "poisson") -> None:
        if normaliser not in NORMALISERS:
            raise ValueError(f"normaliser must be one of {', '.join(NORMALISERS)}, got {normaliser!r}")
        if batches not in BATCHES:
            raise ValueError(f"batches must be one of {', '.join(BATCHES)}, got {batches!r}")
        self.info = ImplementationInfo(name=name, library="torch", requires=("torch", "dp_accounting"))
        self.normaliser = normaliser
        self.batches = batches

    def train(self, request: TrainingRequest) -> TrainedModel:
        import torch

        from dpverify.torch import as_tensors, black_boxes, build_mlp, poisson_batches, seeds_for
        from dpverify_reference import accounting

        hp = request.hyperparameters
        sigma = hp.noise_multiplier
        if sigma is None:
            sigma = accounting.calibrate_noise_multiplier(hp.target_epsilon, hp.sampling_rate, hp.steps, hp.delta)
        seeds = seeds_for(request.seed)
        model = build_mlp(request, seed=seeds.init)
        features, labels = as_tensors(request)
        noise = torch.Generator().manual_seed(seeds.noise)
        loss = torch.nn.CrossEntropyLoss()
        if self.batches == "poisson":
            batches = poisson_batches(request.num_records, hp.sampling_rate, hp.steps, seed=seeds.sampling)
        else:
            shuffle = torch.Generator().manual_seed(seeds.sampling)
            loader = torch.utils.data.DataLoader(
                range(request.num_records), batch_size=-(-request.num_records // hp.steps_per_epoch), shuffle=True,
                generator=shuffle,
            )  # fmt: skip
            batches = (batch for _ in range(hp.epochs) for batch in loader)
        hand_over(request, 0, model)
        for step, batch in enumerate(batches, start=1):
            total = [torch.zeros_like(p) for p in model.parameters()]
            for i in batch.tolist():
                model.zero_grad()
                loss(model(features[i : i + 1]), labels[i : i + 1]).backward()
                grads = [p.grad for p in model.parameters()]
                norm = torch.sqrt(sum((g**2).sum() for g in grads))
                scale = min(1.0, hp.max_grad_norm / (float(norm) + 1e-12))
                total = [t + g * scale for t, g in zip(total, grads)]
            divisor = {
                "designated": hp.normaliser(request.num_records),
                "dataset": hp.sampling_rate * request.num_records,
                "realised": max(1, len(batch)),
            }[self.normaliser]
            with torch.no_grad():
                for p, t in zip(model.parameters(), total):
                    t = t + torch.normal(0.0, sigma * hp.max_grad_norm, size=p.shape, generator=noise)
                    p.add_(t / divisor, alpha=-hp.learning_rate)
            hand_over(request, step, model)
        claim = PrivacyClaim(
            epsilon=accounting.rdp_epsilon(sigma, hp.sampling_rate, hp.steps, hp.delta),
            delta=hp.delta,
            accountant="dp_accounting.rdp",
            noise_multiplier=sigma,
            sampling_rate=hp.sampling_rate,
            steps=hp.steps,
        )
        return TrainedModel(**black_boxes(model, request), claim=claim, device="cpu")
