"""`python -m app`: the same as `ckptguard serve` (settings from CKPTGUARD_* variables)."""

from app.main import serve

if __name__ == "__main__":
    serve()
