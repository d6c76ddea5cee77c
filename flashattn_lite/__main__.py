"""``python -m flashattn_lite``: the same command as ``flashattn-lite``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
