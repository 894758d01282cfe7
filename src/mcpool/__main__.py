"""`python -m mcpool ...`: the same as the `mcpool` console script."""

from mcpool.daemon._cli import main

raise SystemExit(main())
