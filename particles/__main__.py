from .app.interrupts import program_signals

program_signals()   # first line: SIGINT/SIGTERM recorded from here on, acted on by main()

import sys  # noqa: E402

from .app.cli import main  # noqa: E402

sys.exit(main())
