"""What ``ensemble/runtime/stage.py`` stages and how the copy is made to refer to itself,
on a made-up environment tree (a venv made from an interpreter prefix, an editable
install); the MPI program itself is tested in tests/mpi/test_stage_mpi.py."""

from __future__ import annotations

import os

import pytest

from ensemble.runtime import stage


@pytest.fixture
def tree(tmp_path):
    """A pyenv-like interpreter prefix, a venv made from it, and an editable project."""
    home = tmp_path / "shared" / "python"
    version = "python3.11"
    for rel in (f"lib/{version}/os.py", f"lib/{version}/json/__init__.py", f"lib/{version}/test/test_x.py",
                f"lib/{version}/site-packages/big/__init__.py", "lib/libpython3.11.so.1.0", "lib/libssl.a",
                "share/man/python.1", "bin/pip3"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(rel)
    (home / "bin" / "python3.11").write_text("#!binary")
    (home / "bin" / "python3").symlink_to("python3.11")
    env = tmp_path / "shared" / "venv"
    sp = env / "lib" / version / "site-packages"
    (sp / "numpy").mkdir(parents=True)
    (sp / "numpy" / "__init__.py").write_text("")
    (sp / "numpy" / "__pycache__").mkdir()
    (sp / "numpy" / "__pycache__" / "x.cpython-311.opt-1.pyc").write_text("")
    (sp / "numpy" / "__pycache__" / "x.cpython-311.pyc").write_text("")
    (env / "bin").mkdir()
    (env / "bin" / "python3").symlink_to(home / "bin" / "python3")
    (env / "bin" / "python").symlink_to("python3")
    (env / "lib64").symlink_to("lib")
    (env / "pyvenv.cfg").write_text(f"home = {home}/bin\ninclude-system-site-packages = false\n"
                                    f"executable = {home}/bin/python3.11\n")
    src = tmp_path / "checkout"
    (src / "mypkg" / "sub").mkdir(parents=True)
    (src / "mypkg" / "__init__.py").write_text("")
    (src / "mypkg" / "sub" / "m.py").write_text("")
    (sp / "__editable___mypkg_0_1_finder.py").write_text(
        f"MAPPING: dict[str, str] = {{'mypkg': '{src / 'mypkg'}'}}\nNAMESPACES = {{}}\n")
    (sp / "__editable__.mypkg-0.1.pth").write_text("import __editable___mypkg_0_1_finder; x()\n")
    (sp / "old.pth").write_text(f"{tmp_path / 'elsewhere'}\n")
    return env, home, src


def test_the_environment_is_found_from_the_interpreter_path(tree):
    env, home, _ = tree
    assert stage.venv_of(str(env / "bin" / "python")) == env
    assert stage.venv_home(env) == home


def test_staged_members_the_venv_editable_sources_and_only_the_interpreter_of_its_prefix(tree):
    env, home, src = tree
    names = dict((name, path) for path, name in stage.members(env, home, stage.DEFAULT_EXCLUDES))
    sp = "venv/lib/python3.11/site-packages"
    assert f"{sp}/numpy/__init__.py" in names
    assert f"{sp}/numpy/__pycache__/x.cpython-311.pyc" in names           # bytecode kept: nothing to compile
    assert f"{sp}/numpy/__pycache__/x.cpython-311.opt-1.pyc" not in names
    assert names[f"{sp}/mypkg/sub/m.py"] == src / "mypkg" / "sub" / "m.py"  # the checkout, inside the copy
    assert not any("__editable__" in n for n in names)                     # ... and no hook back to it
    assert "venv/lib64" in names and "venv/bin/python3" in names           # links staged as links
    assert {"base/bin/python3", "base/bin/python3.11", "base/lib/libpython3.11.so.1.0",
            "base/lib/python3.11/os.py", "base/lib/python3.11/json/__init__.py"} <= set(names)
    # never the interpreter's own packages, tests, static libraries or other tools
    assert not any(n.startswith(("base/lib/python3.11/site-packages", "base/lib/python3.11/test", "base/share",
                                 "base/bin/pip")) or n.endswith(".a") for n in names)
    assert [n for n, _ in sorted(names.items())] == sorted(names)


def test_user_excludes_and_no_python(tree):
    env, _, _ = tree
    names = {name for _, name in stage.members(env, None, ("lib/python3*/site-packages/numpy",))}
    assert not any("numpy" in n for n in names) and not any(n.startswith("base/") for n in names)


def test_a_path_pth_outside_the_environment_is_said(tree):
    env, _, _ = tree
    assert stage.path_pth_entries(env) == [str(env.parent.parent / "elsewhere")]


def test_the_copy_refers_to_itself(tree, tmp_path):
    env, home, _ = tree
    dest = tmp_path / "node" / "env"
    for path, name in stage.members(env, home, stage.DEFAULT_EXCLUDES):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        else:
            target.write_bytes(path.read_bytes())
    stage.repoint(dest, env, home)
    assert os.readlink(dest / "venv" / "bin" / "python3") == str(dest / "base" / "bin" / "python3")
    assert os.readlink(dest / "venv" / "bin" / "python") == "python3"
    cfg = (dest / "venv" / "pyvenv.cfg").read_text()
    assert f"home = {dest}/base/bin" in cfg and f"executable = {dest}/base/bin/python3.11" in cfg
    assert str(home) not in cfg
    launcher = (dest / "python").read_text()
    assert f'exec "{dest}/venv/bin/python"' in launcher and f"{dest}/base/lib" in launcher
    assert os.access(dest / "python", os.X_OK)


def test_install_replaces_an_older_copy_and_writes_the_marker_last(tree, tmp_path):
    env, home, _ = tree
    dest = tmp_path / "env"
    (dest / "venv" / "stale").mkdir(parents=True)
    incoming = stage.incoming_dir(dest)
    (incoming / "venv" / "bin").mkdir(parents=True)
    (incoming / "venv" / "pyvenv.cfg").write_text((env / "pyvenv.cfg").read_text())
    (incoming / "base").mkdir()
    stage.install(incoming, dest, env, home, {"env": "x"})
    assert not (dest / "venv" / "stale").exists() and not incoming.exists()
    assert (dest / stage.MARKER).is_file() and (dest / "python").is_file()


class FakeComm:
    """Broadcasts recorded in order: what BcastWriter sends and BcastReader receives."""

    def __init__(self, sent=None):
        self.sent = sent if sent is not None else []

    def bcast(self, value, root=0):
        if value is None:
            return self.sent.pop(0)
        self.sent.append(value)
        return value

    def Bcast(self, buf, root=0):
        data, _ = buf
        if isinstance(data, bytearray) and self.sent and isinstance(self.sent[0], bytes | bytearray):
            data[:] = self.sent.pop(0)
        else:
            self.sent.append(bytes(data))


class FakeMPI:
    BYTE = "byte"


def test_the_stream_arrives_whole_and_a_local_unpacking_that_stopped_never_blocks_the_root(monkeypatch):
    monkeypatch.setattr(stage, "CHUNK", 1000)
    comm = FakeComm()
    read_end, write_end = os.pipe()
    tee = os.fdopen(write_end, "wb")
    os.close(read_end)                                   # the local unpacking died: nobody reads the pipe
    writer = stage.BcastWriter(comm, FakeMPI, tee)
    payload = bytes(range(256)) * 20
    writer.write(payload[:3000])
    writer.write(payload[3000:])
    writer.finish()                                      # no BrokenPipeError, no hang
    assert writer.sent == len(payload) and writer.tee is None
    reader = stage.BcastReader(FakeComm(list(comm.sent)), FakeMPI)
    got = bytearray()
    buf = bytearray(700)
    while (n := reader.readinto(buf)):
        got += buf[:n]
    assert bytes(got) == payload and reader.done
