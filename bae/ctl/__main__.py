"""`python -m bae.ctl`: baectl."""

from bae.ctl import main

raise SystemExit(main())
