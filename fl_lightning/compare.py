"""``python -m fl_lightning.compare DIR``: the short name of :mod:`fl_lightning.experiments.comparison`'s command."""

import sys

from fl_lightning.experiments.comparison import main

if __name__ == "__main__":
    sys.exit(main())
