"""``python -m fl_lightning.curves RUN_DIR ... --out DIR``: the short name of
:mod:`fl_lightning.experiments.curves`'s command."""

import sys

from fl_lightning.experiments.curves import main

if __name__ == "__main__":
    sys.exit(main())
