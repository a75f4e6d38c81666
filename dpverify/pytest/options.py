"""The plugin's settings: each has a ``--dp-audit-*`` flag, an ini twin and an environment variable.

Precedence is marker > command line > environment > ini > default, and a bad value names where it came
from. Pure Python: the plugin imports this at start-up, so nothing heavy belongs here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from dpverify.execution import EXECUTORS

#: :data:`dpverify.config.PROFILE_NAMES`, spelled out so that start-up imports nothing heavy (a test keeps them equal).
PROFILE_CHOICES = ("quick", "standard", "gpu", "mlp", "paper")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: The words of :data:`dpverify.gate.WORLD_CHOICE_WORDS`, spelled out so that start-up imports nothing heavy
#: (a test keeps them equal); world names are checked against the registry only when given.
WORLD_WORDS = ("applicable", "none")
#: When ``--dp-audit-progress`` shows each audit's progress line (see :mod:`dpverify.pytest.progress`).
PROGRESS_CHOICES = ("auto", "always", "never")


class OptionError(ValueError):
    """A setting has a bad value; the message names the setting and where the value came from."""


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError(f"must be in (0, 1), got {value:g}")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def _positive_or_inf(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0 (or inf), got {value:g}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _worlds(text: str) -> str | tuple[str, ...]:
    """``applicable``, ``none``, or comma-separated names of registered worlds."""
    if text.strip() in WORLD_WORDS:
        return text.strip()
    from dpverify.canaries.worlds import world_names  # numpy: imported only when names are given

    names = _names(text)
    unknown = [name for name in names if name not in world_names()]
    if not names or unknown:
        raise ValueError(f"must be {' or '.join(WORLD_WORDS)} or names among {', '.join(world_names())}, got {text!r}")
    return names


def _layer_choice(text: str) -> str:
    """``applicable`` or ``none``."""
    if text.strip() not in WORLD_WORDS:
        raise ValueError(f"must be {' or '.join(WORLD_WORDS)}, got {text!r}")
    return text.strip()


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"must be true or false, got {text!r}")
    return lowered in ("1", "true", "yes", "on")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0 seconds, got {value:g}")
    return value


def _assignments(text: str) -> tuple[str, ...]:
    """``NAME=VALUE`` pairs, one per line or separated by ';'."""
    pairs = tuple(pair.strip() for line in text.splitlines() for pair in line.split(";") if pair.strip())
    for pair in pairs:
        name, sep, _ = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"takes NAME=VALUE, got {pair!r}")
    return pairs


@dataclass(frozen=True)
class Setting:
    """One setting: ``--dp-audit-<name>``, ini ``dp_audit_<name>``, env ``DPVERIFY_<NAME>``."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = "VALUE"
    shown_default: str | None = None
    repeated: bool = False
    switch: bool = False

    @property
    def flag(self) -> str:
        return f"--dp-audit-{self.name}"

    @property
    def ini(self) -> str:
        return f"dp_audit_{self.name.replace('-', '_')}"

    @property
    def env(self) -> str:
        return f"DPVERIFY_{self.name.replace('-', '_').upper()}"

    @property
    def dest(self) -> str:
        return f"dp_audit_{self.name.replace('-', '_')}"


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "profile",
        _choice(PROFILE_CHOICES),
        "quick",
        "audit profile: quick (CI on 2 CPU cores: seconds per audit), standard (a minute or two per audit), gpu, "
        "mlp (UniAud's MLP) or paper (GPU); `dpverify audit --help` gives each one's size",
        "NAME",
    ),
    Setting(
        "confidence",
        _probability,
        0.95,
        "session-wide confidence: a correct implementation fails anywhere in the session with probability "
        "at most 1 - confidence (the level is divided among the session's audits)",
        "P",
    ),
    Setting(
        "confidence-per-audit",
        _probability,
        None,
        "every audit's own confidence, instead of the session's split (to reproduce one audit at the level "
        "it ran at: the failure message prints it)",
        "P",
        shown_default="the session's level divided among the planned audits",
    ),
    Setting("seed", _seed, None, "seed for every audit of the session", "N", shown_default="random, printed in the header"),
    Setting("device", _choice(DEVICE_CHOICES), "auto", "device to train on: auto (CUDA when available), cpu or cuda (an error without a GPU)", "NAME"),
    Setting("epsilon", _positive_or_inf, 2.0, "target ε the ready-made audits ask each implementation to calibrate to", "EPS"),
    Setting(
        "implementations",
        _names,
        (),
        "comma-separated names or glob patterns of the registered implementations to audit (ready-made "
        "audits and dp_implementation), a pattern after ! leaving out what it matches ('*,!opacus-lm*'); a "
        "pattern that matches nothing is an error; none: no implementation",
        "NAMES",
        shown_default="those your conftest or packages register, not dpverify's own",
    ),
    Setting(
        "worlds",
        _worlds,
        "applicable",
        "the two-world (many-run) audits collected beside each implementation's one-run audit: applicable "
        "(every crafted world that applies to it, see `dpverify list`), none, or comma-separated world names",
        "WORLDS",
    ),
    Setting(
        "every-update",
        _flag,
        True,
        "collect each classifier's every-update audit beside its one-run audit (its adversary sees the "
        "parameters after every step, so a claim at q < 1 is tested at its own curve); false: none",
        "BOOL",
    ),
    Setting(
        "layers",
        _layer_choice,
        "applicable",
        "the layer-design audits collected beside each implementation's one-run audit: applicable (each layer "
        "type the implementation trains, see `dpverify list`) or none",
        "LAYERS",
    ),
    Setting(
        "set",
        _assignments,
        (),
        "an audit setting for every audit, as a marker keyword (e.g. max_grad_norm=0.5); VALUE is a Python "
        "literal; repeat the flag, or separate with ';' (a marker's keyword wins)",
        "NAME=VALUE",
        shown_default="none",
        repeated=True,
    ),
    Setting("strict", _flag, False, "fail (rather than skip) an audit that cannot decide (verdict undecided)", switch=True),
    Setting(
        "only",
        _flag,
        False,
        "run only the DP audits (implies --dp-audit): the ready-made ones and the tests marked dp_audit or using "
        "the dp_audit fixture; the other tests are deselected",
        switch=True,
    ),
    Setting(
        "skip",
        _flag,
        False,
        "deselect every DP audit: the ready-made ones and the tests marked dp_audit or using the dp_audit fixture",
        switch=True,
    ),
    Setting(
        "timeout",
        _seconds,
        None,
        "time limit of one training run in seconds (a pooled audit trains several); past it the audit ends as verdict error naming the "
        "limit",
        "SECONDS",
        shown_default="the profile's (30 min per training run, 1 h for gpu, 4 h for paper)",
    ),
    Setting(
        "progress",
        _choice(PROGRESS_CHOICES),
        "auto",
        "each audit's progress (stage, run, DP step, seconds): auto (a line redrawn on a terminal, none with -q "
        "or under xdist), always (also as log lines when output is not a terminal) or never",
        "WHEN",
    ),
    Setting(
        "executor",
        _choice(EXECUTORS),
        None,
        "where the independent runs of an audit train (a two-world audit's, pooled runs): inprocess, pool (local worker "
        "processes) or ray (a Ray cluster; pip install 'dpverify[ray]'); results are the same by seed",
        "NAME",
        shown_default="inprocess, or pool with --dp-audit-workers",
    ),
    Setting(
        "workers",
        _count,
        None,
        "worker processes of the pool executor (or CPUs of a local Ray cluster); implies the pool executor",
        "N",
        shown_default="one per core when the executor is pool",
    ),
    Setting(
        "ray-address",
        str,
        None,
        "address of a running Ray cluster for the ray executor: auto (the one `ray start --head` runs here) or "
        "ray://HOST:10001",
        "ADDRESS",
        shown_default="a local Ray cluster started for the session",
    ),
    Setting("report", str, None, "write a JSON report of every audit to PATH (rewritten after each audit)", "PATH", shown_default="none"),
    Setting("plots", str, None, "write per-audit PNG plots to DIR (needs matplotlib)", "DIR", shown_default="none"),
    Setting(
        "compare",
        str,
        None,
        "compare this run's audits with a saved JSON report (an earlier --dp-audit-report): baseline and now "
        "side by side, and a flag where an audit's rate of correct guesses rose significantly (Fisher's exact "
        "test at the session's level split over the compared audits)",
        "BASELINE.json",
        shown_default="none",
    ),
    Setting("compare-fail", _flag, False, "fail the session when --dp-audit-compare finds a significant rise", switch=True),
)
SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}


def add_options(parser: Any) -> None:
    """Register ``--dp-audit``, every ``--dp-audit-*`` flag and their ini twins with pytest."""
    group = parser.getgroup("dp-audit", "differential privacy audits (dpverify)")
    group.addoption(
        "--dp-audit",
        action="store_true",
        default=None,
        dest="dp_audit",
        help="run the DP audits (without it they are skipped); ini: dp_audit, env: DPVERIFY_AUDIT=1",
    )
    parser.addini("dp_audit", "run the DP audits (as --dp-audit)", type="bool", default=False)
    for setting in SETTINGS:
        shown = setting.shown_default if setting.shown_default is not None else setting.default
        group.addoption(
            setting.flag,
            dest=setting.dest,
            default=None,
            **(
                dict(action="store_const", const="true")
                if setting.switch
                else dict(action="append" if setting.repeated else "store", metavar=setting.metavar)
            ),
            help=f"{setting.help} [ini: {setting.ini}, env: {setting.env}, default: {shown}]",
        )
        parser.addini(setting.ini, setting.help, type="linelist" if setting.repeated else "string", default=None)


def audit_enabled(config: Any) -> bool:
    if config.getoption("dp_audit") or audit_selection(config) == "only":
        return True
    env = os.environ.get("DPVERIFY_AUDIT")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    return bool(config.getini("dp_audit"))


def resolve(config: Any, name: str) -> Any:
    """The value of setting ``name`` by command line > environment > ini > default."""
    setting = SETTINGS_BY_NAME[name]
    candidates = (
        (config.getoption(setting.dest), f"command-line option {setting.flag}"),
        (os.environ.get(setting.env), f"environment variable {setting.env}"),
        (config.getini(setting.ini), f"ini option {setting.ini}"),
    )
    for raw, source in candidates:
        if isinstance(raw, (list, tuple)):  # a repeated flag, or an ini linelist
            raw = "\n".join(raw)
        if raw is None or raw == "":
            continue
        try:
            return setting.parse(str(raw))
        except ValueError as exc:
            raise OptionError(f"{source}={raw!r} is invalid: {setting.name} {exc}") from None
    return setting.default


def audit_selection(config: Any) -> str | None:
    """``"only"`` (``--dp-audit-only``: run only the audits), ``"skip"`` (``--dp-audit-skip``: deselect them)
    or ``None``; both is an :class:`OptionError`."""
    only, skip = resolve(config, "only"), resolve(config, "skip")
    if only and skip:
        raise OptionError("--dp-audit-only runs only the DP audits and --dp-audit-skip deselects them; give one of them")
    return "only" if only else "skip" if skip else None
