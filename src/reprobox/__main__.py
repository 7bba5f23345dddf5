import sys

from reprobox.cli.main import main

sys.exit(main())
