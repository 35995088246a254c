"""``runtime.env.QuietImport``: TensorFlow's import banners (C++ lines on file descriptor 2)
filtered, every other line passed on, an import error still raised; and
``runtime.mpi.exit_after``; each in a subprocess, whose stderr and status the test reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_first_import_is_filtered_once_and_errors_pass(tmp_path):
    (tmp_path / "noisy.py").write_text(textwrap.dedent("""
        import os
        os.write(2, b"BANNER: before logging is set up\\n")
        os.write(2, b"a real warning\\n")
        if os.environ.get("FAIL"):
            raise ImportError("the library is broken")
    """))
    script = textwrap.dedent("""
        import os, sys
        from ensemble.runtime.env import QuietImport
        sys.meta_path.insert(0, QuietImport(names=("noisy",), banners=("BANNER",)))
        try:
            import noisy
        except ImportError as exc:
            print("raised:", exc, file=sys.stderr)
        os.write(2, b"after the import\\n")
        assert not any(isinstance(f, QuietImport) for f in sys.meta_path)
    """)
    for fail in ("", "1"):
        env = {"PYTHONPATH": f"{tmp_path}:{sys.path[0]}", "FAIL": fail, "PATH": "/usr/bin:/bin"}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                              cwd=str(tmp_path), timeout=60)
        assert done.returncode == 0, done.stderr
        assert "BANNER" not in done.stderr and "a real warning\n" in done.stderr
        assert done.stderr.endswith("after the import\n")
        assert ("raised: the library is broken" in done.stderr) == bool(fail)


def test_a_rank_whose_interrupt_was_lost_leaves_anyway_with_the_interrupts_status():
    """``runtime.mpi.exit_after``: armed by a worker's Ctrl-C/SIGTERM handler; a process that
    swallowed the KeyboardInterrupt (TensorFlow's ``__del__``) and went on still leaves, with
    130, instead of being killed by mpiexec (exit 9, "BAD TERMINATION")."""
    script = textwrap.dedent("""
        import time
        from ensemble.runtime import mpi
        mpi.exit_after(0.5, mpi.EXIT_INTERRUPTED)
        mpi.exit_after(60, 1)                      # armed once: the first stands
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass                                   # lost, as in a __del__
        time.sleep(30)
        raise SystemExit(0)
    """)
    env = {"PYTHONPATH": sys.path[0], "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=25)
    assert done.returncode == 130, done.stderr
