"""``python -m dpverify``: the ``dpverify`` command (:mod:`dpverify.cli`)."""

import sys

from dpverify.cli import main

sys.exit(main())
