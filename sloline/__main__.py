"""`python -m sloline` runs the CLI (used to start worker processes)."""

from sloline.cli import main

raise SystemExit(main())
