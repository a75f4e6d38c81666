"""TensorFlow, imported without the three CUDA-factory lines its 2.15 wheel logs at import (imports tensorflow).

TF 2.15's pip wheel registers its cuDNN, cuFFT and cuBLAS factories twice and logs each duplicate at
ERROR level ("Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one
has already been registered"), on every machine, GPU or not (tensorflow/tensorflow#62075); they are
harmless. ``TF_CPP_MIN_LOG_LEVEL=2`` (set here unless the user set it) hides INFO and WARNING but not
these ERROR lines; ``3`` would hide them but also every real error, for the whole process, since
TensorFlow reads it once. So the import runs with file descriptor 2 captured, and everything it wrote
is written back except exactly those lines.

AutoGraph warns, through the ``tensorflow`` logger, each time it traces a function whose source it cannot
read: TF-Privacy's fast-clipping registry calls ``os.path.commonprefix``, which Python 3.11 freezes into
the interpreter (``<frozen genericpath>``), so every traced step logged three lines saying it runs the
function as-is, which is right for a standard-library helper. A filter on that logger drops exactly those
warnings, for functions of frozen modules; AutoGraph's other warnings are kept.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile

__all__ = ["tf", "is_frozen_function_warning", "without_duplicate_factory_lines"]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter; a user's setting wins

_DUPLICATE_FACTORY = re.compile(
    r"Unable to register cu(DNN|FFT|BLAS) factory: Attempting to register factory for plugin cu\w+ "
    r"when one has already been registered"
)


def without_duplicate_factory_lines(text: str) -> str:
    """``text`` without the duplicate-factory lines; every other line, errors included, is kept."""
    return "".join(line for line in text.splitlines(keepends=True) if not _DUPLICATE_FACTORY.search(line))


def is_frozen_function_warning(record: logging.LogRecord) -> bool:
    """Whether ``record`` is AutoGraph's "could not transform" warning about a frozen module's function."""
    if not str(record.msg).startswith("AutoGraph could not transform") or not record.args:
        return False
    code = getattr(record.args[0], "__code__", None)
    return code is not None and code.co_filename.startswith("<frozen ")


def _import_tensorflow():
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            sys.stderr.write(without_duplicate_factory_lines(captured.read().decode(errors="replace")))
            sys.stderr.flush()
    return tensorflow


tf = _import_tensorflow()
tf.get_logger().addFilter(lambda record: not is_frozen_function_warning(record))
