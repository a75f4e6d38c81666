"""dpverify: audit differentially private training implementations with one-run UniAud audits."""

__version__ = "0.1.0"
