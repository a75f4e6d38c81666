import importlib

pytest_plugins = ["pytester"]

# pytester's in-process runs drop modules first imported inside them; importing these extension-heavy
# libraries twice in one process crashes, so they are imported once here, before any pytester run.
for _module in ("numpy", "scipy.stats", "scipy.special", "torch", "torch._inductor.test_operators", "opacus", "matplotlib.pyplot"):
    try:
        importlib.import_module(_module)
    except ImportError:
        pass
