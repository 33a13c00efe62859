"""`python -m ckptguard.app`: the same as `ckptguard serve` (settings from CKPTGUARD_* variables)."""

from ckptguard.app.main import serve

if __name__ == "__main__":
    serve()
