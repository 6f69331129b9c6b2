"""``python -m snapflow.cli``: the ``snapflow`` command without the console script."""

from snapflow.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
