"""`python -m runners.torchrun ARGS`: torchrun (torch.distributed.run) with ARGS, ending by the signal
that stopped it.

torchrun passes SIGTERM, SIGINT or SIGHUP on to its workers, waits for them, and exits 1, as it does
when a worker fails; here it then ends by that signal instead, so the launcher tells a run stopped by a
signal from a failed one (runners.launch).
"""

from __future__ import annotations

import os
import signal


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except SignalException as stop:  # its workers are stopped already
        signal.signal(stop.sigval, signal.SIG_DFL)
        os.kill(os.getpid(), stop.sigval)


if __name__ == "__main__":
    main()
