import sys

from reprobox.cli.main import program

sys.exit(program())
