"""``dpverify audit --jobs N``: the implementations dealt among N processes of one environment give the same
audits, table, report and level as one process, and each environment given with ``--env`` deals its own."""

import json
import subprocess
import sys

import pytest

from dpverify.environments import deal, families, share_jobs
from tests.test_environments import REPO, setup  # noqa: F401  (the fixture)

#: What differs between two runs of the same audits: the clock, and which process ran each.
UNSTABLE = {"seconds", "auditor_seconds", "environment"}


def test_deal_keeps_a_family_in_one_hand_and_drops_empty_ones():
    """An implementation and the variants named after it share what a process makes once (a traced step,
    their claim's curves): one hand gets them all."""
    names = ["a", "a-variant", "b", "b-variant", "c", "ab"]
    assert families(names) == {"a": "a", "a-variant": "a", "b": "b", "b-variant": "b", "c": "c", "ab": "ab"}
    assert deal(names, 2) == [("a", "a-variant", "c"), ("b", "b-variant", "ab")]
    assert deal(names, 1) == [tuple(names)]
    assert deal(["a", "a-v1", "a-v2"], 3) == [("a", "a-v1", "a-v2")]
    # Users of one sampler too: each process plans the world run once per sampler over its own hand.
    assert deal(["x", "y", "z", "w"], 2, together={"x": "loader", "z": "loader", "y": None}) == [("x", "z", "w"), ("y",)]
    assert deal(["a"], 3) == [("a",)]
    assert deal([], 2) == []


def test_deal_by_audit_counts_gives_the_largest_first_to_the_lightest_hand():
    """Longest first: each implementation, most audits first, to the hand with the fewest so far; each hand
    keeps the names' order. (Round robin would give 19 and 12 here.)"""
    counts = {"ghost": 9, "hooks": 9, "ref": 8, "v1": 1, "v2": 1, "v3": 2, "lm": 1}
    hands = deal(list(counts), 2, audits=counts)
    assert hands == [("ghost", "ref"), ("hooks", "v1", "v2", "v3", "lm")]
    assert [sum(counts[n] for n in hand) for hand in hands] == [17, 14]
    assert deal(["a", "b", "c"], 2, audits={}) == deal(["a", "b", "c"], 2)


def _audit(report, *args):
    run = subprocess.run(
        [sys.executable, "-m", "dpverify", "audit", "--worlds", "none", "--every-update", "off", "--seed", "7", "--m", "400", "--report",
         str(report), *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run, json.loads(report.read_text())


def _stable(report):
    return {e["nodeid"]: {k: v for k, v in e.items() if k not in UNSTABLE} for e in report["audits"]}


def test_jobs_give_the_audits_of_one_process_and_each_environment_deals_its_own(setup, tmp_path):  # noqa: F811
    registrations, environment = setup
    names = ("home-oblivious", "family-oblivious", "family-memoriser", "--import", registrations, "--env", environment)
    _, alone = _audit(tmp_path / "one.json", *names)
    run, shared = _audit(tmp_path / "two.json", *names, "--jobs", "3")  # 1 here, 2 for the family's 2 audits
    assert _stable(shared) == _stable(alone)
    assert shared["planned_audits"] == alone["planned_audits"] == 2 and shared["complete"]
    # The family's environment dealt its two implementations to two processes of its own Python.
    assert f"2 audit(s) of family-memoriser, family-oblivious run in {environment}" in run.stderr
    assert "1 audit(s) of family-oblivious run in this environment" in run.stderr
    assert all(name in run.stdout for name in ("home-oblivious", "family-oblivious", "family-memoriser"))


def test_jobs_must_be_a_positive_integer(capsys):
    from dpverify.cli import main

    with pytest.raises(SystemExit):
        main(["audit", "reference-dpsgd", "--jobs", "0"])
    assert "--jobs must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("jobs", "audits", "shares"),
    [(3, [93, 20], [2, 1]), (2, [93, 20], [1, 1]), (1, [5, 5], [1, 1]), (4, [93, 20], [3, 1]), (6, [10, 10, 10], [2, 2, 2]),
     (5, [1, 0], [4, 1]), (3, [0, 0], [1, 1])],
)  # fmt: skip
def test_jobs_are_shared_among_the_environments_by_their_audits_at_least_one_each(jobs, audits, shares):
    assert share_jobs(jobs, audits) == shares
