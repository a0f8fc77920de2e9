import signal
import sys


def _terminate(signum, frame):   # SIGTERM ends like Ctrl-C wherever a run does not defer it
    raise KeyboardInterrupt


try:
    signal.signal(signal.SIGTERM, _terminate)
    from .app.cli import main
except KeyboardInterrupt:   # Ctrl-C or SIGTERM while Python is still importing
    print("interrupted", file=sys.stderr)
    sys.exit(130)

code = main()
# The work is done and written: a Ctrl-C or SIGTERM now must not turn the interpreter's
# teardown (Taichi's takes ~0.2 s, after Python has put SIG_DFL back on handlers it set)
# into a kill by signal. Ignored signals stay ignored through that teardown.
for _sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_sig, signal.SIG_IGN)
sys.exit(code)
