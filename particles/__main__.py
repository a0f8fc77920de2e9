import sys

try:
    from .app.cli import main
except KeyboardInterrupt:   # Ctrl-C while Python is still importing
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
