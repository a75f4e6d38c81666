import importlib

import pytest

pytest_plugins = ["pytester"]

# pytester's in-process runs drop modules first imported inside them; importing these extension-heavy
# libraries twice in one process crashes, so they are imported once here, before any pytester run.
for _module in ("numpy", "scipy.stats", "scipy.special", "torch", "torch._inductor.test_operators", "opacus", "matplotlib.pyplot"):
    try:
        importlib.import_module(_module)
    except ImportError:
        pass


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long items first (the ready-made audits dpverify's plugin adds, and tests marked slow), the quick ones
    after, each in the order collected: under xdist the last items set when the run ends, and a long one last
    keeps one worker busy while the other idles."""
    items.sort(key=lambda item: not (item.nodeid.startswith("dp-audit::") or item.get_closest_marker("slow")))
