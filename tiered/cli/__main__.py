"""``python -m tiered.cli``: the same entry point as the ``tiered`` command."""

from tiered.cli import main

if __name__ == "__main__":
    main()
