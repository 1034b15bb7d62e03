"""`python -m oomguard._cli`: the `oomguard` command."""

import sys

from .main import main

sys.exit(main())
