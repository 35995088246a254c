"""A stop a signal asked for, kept until it is taken.

The master's SIGTERM and Ctrl-C handlers (``runtime.mpi.abort_on_exception``) raise a
KeyboardInterrupt where the process is, so that it unwinds and closes its journal. Raised while
Python runs a weakref callback or a ``__del__`` (garbage collection), that exception is printed as
"Exception ignored in ..." and dropped: the master went on as if no signal had come (the handler
had already set the signal to be ignored), the launcher killed it later, and the job looked lost
to ``--resume`` (its members crash suspects). So the handler also notes the stop here (``ask``),
and the master's dispatch loop calls ``take()`` at each turn: it raises the stop again when it was
dropped. No MPI here: the serial and simulated masters run the same loop.
"""

from __future__ import annotations

#: the stop asked for and not yet seen to unwind: the exception to raise again
_asked: list[BaseException] = []


def ask(stop: BaseException) -> None:
    """Note ``stop`` (a KeyboardInterrupt the handler is about to raise)."""
    _asked[:] = [stop]


def take() -> None:
    """Raise the stop a signal asked for, if it was dropped (the handler's raise never unwound
    this far): once."""
    if _asked:
        raise _asked.pop()


def forget() -> None:
    """The stop unwound as it should (it reached the top): nothing to raise again."""
    _asked.clear()
