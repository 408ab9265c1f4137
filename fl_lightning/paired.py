"""``python -m fl_lightning.paired DIR METHOD REFERENCE``: the short name of
:mod:`fl_lightning.experiments.paired`'s command."""

import sys

from fl_lightning.experiments.paired import main

if __name__ == "__main__":
    sys.exit(main())
