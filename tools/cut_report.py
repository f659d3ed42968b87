"""fxremat's cut report from a checkout, without installing the ``fxremat-report`` script:

python tools/cut_report.py TARGET [options]     (the same as: fxremat-report TARGET [options])
"""

import sys

from fxremat.cli import main

if __name__ == "__main__":
    sys.exit(main())
