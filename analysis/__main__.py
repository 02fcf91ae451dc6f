import os
import sys

from analysis.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # the reader closed the pipe (`| head`): stop quietly, as cat does
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 141
raise SystemExit(code)
