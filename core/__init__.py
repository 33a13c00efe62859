"""ckptguard core: judge model checkpoints without executing them (a plain library)."""

__version__ = "0.3.6"
