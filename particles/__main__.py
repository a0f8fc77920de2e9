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

sys.exit(main())
