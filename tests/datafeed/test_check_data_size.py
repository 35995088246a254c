"""``--check`` reports the data's size, whether it streams, and a streaming rank's memory."""

import textwrap

import h5py
import numpy as np
import pytest

from ensemble.orchestrate.check import check_main


def config(tmp_path, stream):
    folder = tmp_path / "shards"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        with h5py.File(folder / f"s{i}.h5", "w") as f:
            f["x"], f["y"] = rng.normal(size=(50, 8)).astype(np.float32), rng.integers(0, 2, 50)
    path = tmp_path / f"c_{len(stream)}.toml"
    path.write_text(textwrap.dedent(f"""
        [data]
        source = "shards"
        stream = {stream}
        node_memory_gb = 0.00001
        memory_share = 0.25
        [[architectures]]
        layers = [{{type = "Dense", units = 4}}]
    """))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("stream, says", [
    ('"auto"', "streams: members read it from the files"),     # 4.8 KB of features > 0.25 x 10 KB
    ("false", "held in memory, one shared copy per node"),
])
def test_check_reports_size_streaming_and_memory_per_rank(tmp_path, capsys, stream, says):
    assert check_main(config(tmp_path, stream)) == 0
    out = capsys.readouterr().out
    assert "150 samples in 3 file(s), 4.69 KiB as float32" in out
    assert says in out
    if "streams" in says:
        assert "per rank, the data streamed: about" in out and "fitted at the run's start" in out
        assert "task: classification, 2 classes; samples per class: 0: " in out      # as data read whole
    else:
        assert "per node: the data once" in out


@pytest.mark.slow
def test_check_of_streamed_data_finds_nan_features_and_what_the_run_refuses_to_stream(tmp_path, capsys):
    from datafeed.shards import close_files  # the reader keeps HDF5 files open
    path = config(tmp_path, "true")
    assert check_main(path) == 0
    assert "looks for NaN/inf features (done here: none found)" in capsys.readouterr().out
    close_files()
    with h5py.File(tmp_path / "shards" / "s1.h5", "a") as f:
        f["x"][7, 3] = np.nan
    assert check_main(path) == 2
    assert "s1.h5' of `data.source` holds NaN/inf" in capsys.readouterr().out
    close_files()
    with h5py.File(tmp_path / "shards" / "s1.h5", "a") as f:
        f["x"][7, 3] = 0.0
    text = open(path).read() + "[runtime]\nmembers_per_rank = 2\n"
    open(path, "w").write(text)
    assert check_main(path) == 2                 # the run would refuse it: check says so now
    assert "the data streams (`data.stream`), but packed members" in capsys.readouterr().out


def test_a_csv_beyond_the_memory_share_is_said_by_check_and_the_run(tmp_path, capsys):
    from datafeed.streaming import read_whole_note
    from ensemble.config import load_config
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4))
    table = "a,b,c,d,y\n" + "".join(f"{r[0]},{r[1]},{r[2]},{r[3]},{int(r[0] > 0)}\n" for r in x)
    (tmp_path / "t.csv").write_text(table)      # about 5 KB on disk
    path = tmp_path / "c.toml"
    body = textwrap.dedent("""
        [data]
        source = "t.csv"
        label = "y"
        node_memory_gb = {gb}
        [[architectures]]
        layers = [{{type = "Dense", units = 4}}]
    """)
    path.write_text(body.format(gb=0.00001))     # a share of 2.5 KB
    note = read_whole_note(load_config(str(path)).data)
    assert note is not None and "more than `data.memory_share` = 0.25" in note and "Convert it to Parquet" in note
    assert check_main(str(path)) == 0            # a note, not a problem: the node may hold it
    assert "Note: `data.source`" in capsys.readouterr().out
    path.write_text(body.format(gb=1))
    assert read_whole_note(load_config(str(path)).data) is None
    assert check_main(str(path)) == 0 and "Note:" not in capsys.readouterr().out
