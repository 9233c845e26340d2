"""Slow tier: the whole command line on subsets of the real course files with the real minilm-l6 weights."""
import json

import pytest

import multitask_classifier as mc
from conftest import output_flags
from evaluation import check_predictions_file
from minbert.data.batches import load_task_data, standard_paths
from minbert.run.training_args import data_paths
from minbert.tasks import MULTITASK

pytestmark = pytest.mark.slow

ROWS = {"train": 160, "dev": 200, "test": 120}


def head_of(source, target, rows):
    """The header and the first `rows` data lines of a real file: a subset in the same format."""
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    target.write_text("".join(lines[:rows + 1]), encoding="utf-8")
    return target


@pytest.fixture(scope="module")
def real_subset(protocol_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("protocol_subset")
    for (task, split), path in standard_paths(folder).items():
        if task in MULTITASK:
            head_of(protocol_dir / path.name, path, ROWS[split])
    return folder


def test_short_real_run_answers_every_id_and_learns(real_subset, tmp_path):
    outputs = {flag: tmp_path / f"{flag}.csv" for flag in output_flags().values()}
    argv = ["--data_dir", str(real_subset), "--pretrained", "minilm-l6", "--option", "finetune", "--quiet",
            "--batch_size", "16", "--lr", "5e-5", "--hidden_dropout_prob", "0.1", "--max_length", "48",
            "--first_stages", "sst,sts", "--cycles", "0", "--smart", "--output_dir", str(tmp_path / "run")]
    for flag, path in outputs.items():
        argv += [f"--{flag}", str(path)]
    assert mc.main(argv) == 0

    args = mc.parse_args(argv)
    data = load_task_data(data_paths(args.data_dir, args.data_files, MULTITASK), MULTITASK, set())
    for (task, split), flag in output_flags().items():
        expected = [e.id for e in getattr(data[task], split)]
        check_predictions_file(outputs[flag], expected, task)

    history = json.loads((tmp_path / "run" / "history.json").read_text())
    pretrained, after_sst, after_sts = history
    # minilm-l6 is a sentence-embedding model: STS is strong before any training and must stay so;
    # SST-5 starts near chance and one small epoch must move it clearly.
    assert pretrained["sts_pearson"] > 0.75 and after_sts["sts_pearson"] > 0.75
    assert after_sst["sst_acc"] > pretrained["sst_acc"] + 0.05
