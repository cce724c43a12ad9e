"""`python -m bae`: the `bae` command (bae/cli.py)."""

from bae.cli import main

raise SystemExit(main())
