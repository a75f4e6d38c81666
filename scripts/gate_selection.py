"""Print the default gate's selection, one pattern a line: pyproject.toml's dp_audit_implementations, where it
is written once (with why each implementation is left out) and the pytest plugin reads it as its ini value.
``--exclusions``: only what it leaves out (the ``!`` patterns), for a run that names its own family
(scripts/test.sh's JAX run) and keeps the gate's exclusions."""

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

def gate_patterns() -> list[str]:
    """The patterns of pyproject.toml's ``dp_audit_implementations``, in order."""
    with PYPROJECT.open("rb") as file:
        selection = tomllib.load(file)["tool"]["pytest"]["ini_options"]["dp_audit_implementations"]
    return [pattern.strip() for pattern in selection.split(",") if pattern.strip()]


def main(arguments: list[str]) -> None:
    if arguments not in ([], ["--exclusions"]):
        sys.exit(f"usage: python {sys.argv[0]} [--exclusions]; got {' '.join(arguments)}")
    patterns = gate_patterns()
    if arguments:
        patterns = [pattern for pattern in patterns if pattern.startswith("!")]
    print("\n".join(patterns))


if __name__ == "__main__":
    main(sys.argv[1:])
