"""minbert/data/demo.py, behind scripts/make_demo_data.py: the committed demo data is what the generator writes for
seed 0, byte for byte, whether called from the package or through the script."""
import make_demo_data

from conftest import DEMO
from minbert.data.demo import write_demo_data


def demo_files() -> list[str]:
    return sorted(path.name for path in DEMO.iterdir() if path.name != "README.md")


def test_the_generator_writes_the_committed_demo_data(tmp_path):
    write_demo_data(tmp_path / "demo", seed=0)
    assert sorted(path.name for path in (tmp_path / "demo").iterdir()) == demo_files()
    for name in demo_files():
        assert (tmp_path / "demo" / name).read_bytes() == (DEMO / name).read_bytes(), name


def test_the_script_writes_the_same_files(tmp_path, capsys):
    make_demo_data.main(["--out_dir", str(tmp_path), "--seed", "0"])
    assert capsys.readouterr().out == f"wrote the demo data to {tmp_path}\n"
    for name in demo_files():
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), name


def test_another_seed_writes_other_sentences(tmp_path):
    write_demo_data(tmp_path, seed=1)
    assert (tmp_path / "ids-sst-train.csv").read_bytes() != (DEMO / "ids-sst-train.csv").read_bytes()
