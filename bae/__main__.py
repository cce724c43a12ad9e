"""`python -m bae`: the `bae` command (bae/launcher/cli.py)."""

from bae.launcher.cli import main

raise SystemExit(main())
