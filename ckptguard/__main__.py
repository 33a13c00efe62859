"""`python -m ckptguard`: the `ckptguard` command (scan, get, serve, codes)."""

from ckptguard.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
