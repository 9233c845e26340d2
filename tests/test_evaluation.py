import math
import os
import zipfile

import numpy as np
import pytest

import evaluation
import prepare_submit
from evaluation import (DEFAULT_OUTPUTS, PredictionsFileError, check_predictions_file, error_counts,
                        forgetting_measures, forgetting_table_markdown, history_forgetting_measures, kept_model_score,
                        overall_score, read_predictions, summarize_line, write_predictions)
from minbert.tasks.metrics import paraphrase_metrics, sst_metrics, sts_metrics

HISTORY = [
    {"stage": "qqp", "sst_acc": 0.20, "qqp_acc": 0.80, "sts_pearson": 0.70, "train_qqp_acc": 0.85},
    {"stage": "sts", "sst_acc": 0.50, "qqp_acc": 0.75, "sts_pearson": 0.80, "train_sts_pearson": 0.9},
    {"stage": "sst", "sst_acc": 0.45, "qqp_acc": 0.70, "sts_pearson": 0.85, "train_sst_acc": 0.6},
]


# --- metrics -------------------------------------------------------------------------------


def test_sst_metrics_hand_computed():
    # class 0: F1 1; class 1: TP 1, 1 predicted, 2 gold -> 2/3; class 2: TP 1, 2 predicted, 1 gold -> 2/3
    metrics = sst_metrics([0, 1, 2, 2], [0, 1, 2, 1])
    assert metrics["acc"] == pytest.approx(3 / 4)
    assert metrics["f1_macro"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert metrics["f1_weighted"] == pytest.approx((1 * 1 + 2 * 2 / 3 + 1 * 2 / 3) / 4)


def test_sst_f1_matches_sklearn_including_class_only_predicted():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 4, size=200)  # class 4 never occurs in gold
    pred = rng.integers(0, 5, size=200)
    metrics = sst_metrics(pred, gold)
    assert metrics["f1_macro"] == pytest.approx(sklearn_metrics.f1_score(gold, pred, average="macro"))
    assert metrics["f1_weighted"] == pytest.approx(sklearn_metrics.f1_score(gold, pred, average="weighted"))


def test_paraphrase_metrics_hand_computed():
    # TP 2, 3 predicted positives, 2 gold positives -> F1 = 2*2 / (3+2); class 0: TP 1, 1 predicted, 2 gold -> 2/3;
    # weighted by the gold supports (2 each): (4/5 + 2/3) / 2
    metrics = paraphrase_metrics([1, 1, 1, 0], [1.0, 0.0, 1.0, 0.0])
    assert metrics == pytest.approx({"acc": 3 / 4, "f1": 4 / 5, "f1_weighted": (4 / 5 + 2 / 3) / 2})


def test_paraphrase_weighted_f1_matches_sklearn_and_sits_beside_sst_in_task_metrics():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    gold, pred = rng.integers(0, 2, size=300), rng.integers(0, 2, size=300)
    assert paraphrase_metrics(pred, gold)["f1_weighted"] == pytest.approx(
        sklearn_metrics.f1_score(gold, pred, average="weighted"))
    assert paraphrase_metrics(pred, gold)["f1"] == pytest.approx(sklearn_metrics.f1_score(gold, pred))
    assert list(evaluation.task_metrics("qqp", pred, gold)) == ["qqp_acc", "qqp_f1", "qqp_f1_weighted"]


def test_paraphrase_metrics_rejects_probabilities():
    with pytest.raises(ValueError, match="0 or 1"):
        paraphrase_metrics([0.7, 0.2], [1, 0])


def test_sts_pearson_known_vectors():
    # x deviations (-1, 0, 1), y deviations (-4/3, -1/3, 5/3): r = 3 / (sqrt(2) * sqrt(42)/3)
    assert sts_metrics([1, 2, 3], [1, 2, 4])["pearson"] == pytest.approx(9 / math.sqrt(84))
    assert sts_metrics([1, 2, 3], [3, 2, 1])["pearson"] == pytest.approx(-1.0)


def test_sts_spearman_is_the_pearson_of_average_ranks_as_scipy_computes_it():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 6, 50).astype(float)  # many ties, as STS's labels have
    pred = np.round(gold + rng.normal(0, 1.5, 50), 1)
    expected = scipy_stats.spearmanr(pred, gold).statistic
    assert sts_metrics(pred, gold)["spearman"] == pytest.approx(expected, abs=1e-12)
    # monotone but not linear: Spearman 1, Pearson below
    metrics = sts_metrics([1, 2, 3, 4], [1, 4, 9, 100])
    assert metrics["spearman"] == pytest.approx(1.0) and metrics["pearson"] < 0.9
    assert list(evaluation.task_metrics("sts", [1, 2, 3], [1, 2, 4])) == ["sts_pearson", "sts_spearman"]


def test_sts_constant_predictions_give_zero_with_warning():
    with pytest.warns(RuntimeWarning, match="constant"):
        assert sts_metrics([2.5, 2.5, 2.5], [1.0, 3.0, 4.0]) == {"pearson": 0.0, "spearman": 0.0}


def test_metrics_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        sst_metrics([1, 2, 3], [1, 2])


def test_overall_score_maps_pearson_to_unit_interval():
    assert overall_score(0.5, 0.8, 0.6) == pytest.approx((0.8 + 0.5 + 0.8) / 3)
    assert overall_score(1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert overall_score(0.0, 0.0, -1.0) == pytest.approx(0.0)


def test_summarize_line_formats_in_key_order():
    line = summarize_line({"epoch": 2, "sst_acc": 0.5, "sts_pearson": np.float32(0.25)})
    assert line == "epoch 2 | sst_acc 0.5000 | sts_pearson 0.2500"


# --- prediction files ------------------------------------------------------------------------


def test_default_outputs_are_the_course_cli_paths():
    assert set(DEFAULT_OUTPUTS.values()) == {
        f"predictions/{task}-{split}-out.csv" for task in ("sst", "para", "sts") for split in ("dev", "test")
    }
    assert {task for task, _ in DEFAULT_OUTPUTS} == {"sst", "qqp", "sts"}
    assert set(evaluation.LEADERBOARD_COLUMNS) == {"sst", "qqp", "sts", "cfimdb", "qa"}


def test_write_predictions_round_trip_keeps_order_and_values(tmp_path):
    path = tmp_path / "nested" / "sst-dev-out.csv"
    write_predictions(path, ["c3", "a1", "b2"], np.array([4, 0, 2]), "sst")
    assert path.read_text() == "id,Predicted_Sentiment\nc3,4\na1,0\nb2,2\n"
    assert list(read_predictions(path, "sst").items()) == [("c3", 4), ("a1", 0), ("b2", 2)]


def test_similarity_round_trip_precision(tmp_path):
    path = tmp_path / "sts.csv"
    values = [0.123456789, 4.6, np.float32(1.5), 3]
    write_predictions(path, ["x", "y", "z", "w"], values, "sts")
    read = read_predictions(path, "sts")
    assert list(read) == ["x", "y", "z", "w"]
    assert list(read.values()) == pytest.approx([float(v) for v in values], rel=5e-6)  # 6 significant digits


def test_paraphrase_written_as_integers(tmp_path):
    path = tmp_path / "para.csv"
    write_predictions(path, ["p", "q"], [1.0, 0.0], "qqp")
    assert path.read_text().splitlines() == ["id,Predicted_Is_Paraphrase", "p,1", "q,0"]


@pytest.mark.parametrize(
    "ids, predictions, task, message",
    [
        (["a", "b", "a"], [1, 2, 3], "sst", "repeated ids: a"),
        (["a", "b"], [1], "sst", "2 ids but 1 predictions"),
        (["a"], [2.5], "sst", "not an integer"),
        (["a"], [2], "qqp", "not 0 or 1"),
        (["a"], [float("nan")], "sts", "not finite"),
        (["a"], [1], "mnli", "unknown task"),
    ],
)
def test_write_predictions_rejects_bad_input_without_writing(tmp_path, ids, predictions, task, message):
    with pytest.raises(ValueError, match=message):
        write_predictions(tmp_path / "out.csv", ids, predictions, task)
    assert os.listdir(tmp_path) == []


def test_atomic_write_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sst.csv"
    write_predictions(path, ["a"], [1], "sst")
    write_predictions(path, ["a", "b"], [1, 3], "sst")
    assert os.listdir(tmp_path) == ["sst.csv"]
    assert read_predictions(path, "sst") == {"a": 1, "b": 3}


def test_failed_replace_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "sst.csv"
    write_predictions(path, ["a"], [1], "sst")

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_predictions(path, ["b"], [2], "sst")
    assert os.listdir(tmp_path) == ["sst.csv"]
    assert path.read_text() == "id,Predicted_Sentiment\na,1\n"


def test_read_accepts_course_starter_format(tmp_path):
    path = tmp_path / "sst.csv"
    path.write_text("id \t Predicted_Sentiment \nabc , 3 \ndef , 0 \n")
    assert read_predictions(path, "sst") == {"abc": 3, "def": 0}


def test_check_rejects_duplicate_ids_in_file(tmp_path):
    path = tmp_path / "sst.csv"
    path.write_text("id,Predicted_Sentiment\na,1\nb,2\na,3\n")
    with pytest.raises(PredictionsFileError, match=r"sst.csv:4: duplicate id a"):
        check_predictions_file(path, None, "sst")


def test_check_reports_missing_and_extra_ids(tmp_path):
    path = tmp_path / "para.csv"
    write_predictions(path, ["a", "b", "zz"], [1, 0, 1], "qqp")
    with pytest.raises(PredictionsFileError, match=r"para.csv: 1 missing ids \(c\); 1 unexpected ids \(zz\)"):
        check_predictions_file(path, ["a", "b", "c"], "qqp")
    assert check_predictions_file(path, ["zz", "b", "a"], "qqp") == {"a": 1, "b": 0, "zz": 1}


@pytest.mark.parametrize(
    "content, task, message",
    [
        ("id,Predicted_Similarity\na,1.0\n", "sst", "expected 'id,Predicted_Sentiment'"),
        ("id,Predicted_Sentiment\na,good\n", "sst", "sst.csv:2: invalid Predicted_Sentiment value 'good'"),
        ("id,Predicted_Sentiment\na,1,2\n", "sst", "sst.csv:2: expected 'id,value'"),
        ("", "sst", "header is ''"),
    ],
)
def test_check_rejects_malformed_files(tmp_path, content, task, message):
    path = tmp_path / "sst.csv"
    path.write_text(content)
    with pytest.raises(PredictionsFileError, match=message):
        check_predictions_file(path, None, task)


def test_check_refuses_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "sst.csv"
    path.write_bytes(b"id,Predicted_Sentiment\n\xff\xfe,3\n")
    with pytest.raises(PredictionsFileError, match="sst.csv: not UTF-8 text"):
        check_predictions_file(path, None, "sst")


def test_check_missing_file(tmp_path):
    with pytest.raises(PredictionsFileError, match="nope.csv: file not found"):
        check_predictions_file(tmp_path / "nope.csv", ["a"], "sts")


# --- forgetting table and error counts -----------------------------------------------------


def test_forgetting_table_best_minus_final():
    table = forgetting_table_markdown(HISTORY)
    lines = table.strip().splitlines()
    assert lines[0] == "| stage | SST acc | QQP acc | STS r | overall |"
    assert lines[2].startswith("| 1. qqp | 0.2000 | 0.8000 | 0.7000 |")
    numbered = forgetting_table_markdown([{**HISTORY[0], "stage": "pretrained", "index": 0},
                                          *({**entry, "index": i} for i, entry in enumerate(HISTORY, start=1))])
    # A run's records carry their stage numbers: the pretrained row is 0, the first stage 1, as the trainer prints.
    assert [line.split(" | ")[0] for line in numbered.splitlines()[2:4]] == ["| 0. pretrained", "| 1. qqp"]
    forgetting_row = lines[2 + len(HISTORY)]
    assert forgetting_row.startswith("| forgetting (best − final) |")
    forgetting = [float(cell) for cell in forgetting_row.strip("|").split("|")[1:]]
    overall = [overall_score(h["sst_acc"], h["qqp_acc"], h["sts_pearson"]) for h in HISTORY]
    assert forgetting == pytest.approx([0.50 - 0.45, 0.80 - 0.70, 0.0, max(overall) - overall[-1]], abs=1e-4)


def test_forgetting_table_has_the_weighted_f1s_when_every_stage_has_them_and_the_continual_figures():
    history = [{**entry, "sst_f1_weighted": entry["sst_acc"] - 0.1, "qqp_f1_weighted": entry["qqp_acc"] - 0.1}
               for entry in HISTORY]
    lines = forgetting_table_markdown(history).strip().splitlines()
    assert lines[0] == "| stage | SST acc | QQP acc | STS r | overall | SST F1 (w) | QQP F1 (w) |"
    assert lines[2].endswith("| 0.1000 | 0.7000 |")
    # HISTORY trains qqp, sts, sst once each: the earlier tasks are qqp and sts (the figures' test below by hand).
    assert lines[-4:] == [
        "Continual-learning figures over the stages (task scores sst_acc, qqp_acc, sts_pearson; the model before "
        "training is not a row):",
        "- average score after the last stage: 0.6667",
        "- backward transfer (Lopez-Paz & Ranzato 2017) over qqp, sts: -0.0250",
        "- forgetting (Chaudhry et al. 2018): qqp 0.1000, sts -0.0500; mean 0.0250"]
    older = [{key: value for key, value in entry.items() if key != "qqp_f1_weighted"} for entry in history]
    assert forgetting_table_markdown(older).splitlines()[0].endswith("| overall | SST F1 (w) |")


# --- continual-learning figures of the forgetting matrix -----------------------------------
# Columns sst, qqp, sts; R[l, i] is task i's score after stage l.


def test_forgetting_measures_of_each_task_trained_once():
    scores = [[0.20, 0.80, 0.70],  # after qqp
              [0.25, 0.75, 0.85],  # after sts
              [0.50, 0.70, 0.80]]  # after sst: the last stage, so sst is not an earlier task
    measures = forgetting_measures(scores, ("sst", "qqp", "sts"), [{"qqp"}, {"sts"}, {"sst"}])
    assert measures.average_score == pytest.approx((0.50 + 0.70 + 0.80) / 3)
    # BWT: qqp 0.70 - 0.80 (after stage 0), sts 0.80 - 0.85 (after stage 1)
    assert measures.backward_transfer == pytest.approx((-0.10 - 0.05) / 2)
    # f_i: qqp max(0.80, 0.75) - 0.70, sts max(0.70, 0.85) - 0.80
    assert measures.forgetting == pytest.approx({"qqp": 0.10, "sts": 0.05})
    assert list(measures.forgetting) == ["qqp", "sts"] and measures.average_forgetting == pytest.approx(0.075)


def test_forgetting_measures_of_a_retrained_task_count_from_its_last_training():
    scores = [[0.20, 0.84, 0.70],  # qqp: QQP's best
              [0.20, 0.76, 0.85],  # sts
              [0.50, 0.72, 0.78],  # sst: SST's last training
              [0.45, 0.82, 0.80],  # qqp again: QQP's last training
              [0.40, 0.79, 0.86]]  # sts again, the last stage
    measures = forgetting_measures(scores, ("sst", "qqp", "sts"), [{"qqp"}, {"sts"}, {"sst"}, {"qqp"}, {"sts"}])
    assert measures.average_score == pytest.approx((0.40 + 0.79 + 0.86) / 3)
    # BWT from each task's last training: sst 0.40 - 0.50 (stage 2), qqp 0.79 - 0.82 (stage 3)
    assert measures.backward_transfer == pytest.approx((-0.10 - 0.03) / 2)
    # f_i from each task's best before the last stage, whenever it was: sst 0.50 - 0.40, qqp 0.84 - 0.79
    assert measures.forgetting == pytest.approx({"sst": 0.10, "qqp": 0.05})


def test_forgetting_measures_leave_out_a_task_no_stage_trained_but_keep_its_rows():
    scores = [[0.22, 0.63, 0.81],  # simcse: trains no head
              [0.23, 0.80, 0.75],  # qqp
              [0.50, 0.78, 0.70]]  # sst
    measures = forgetting_measures(scores, ("sst", "qqp", "sts"), [set(), {"qqp"}, {"sst"}])
    assert measures.average_score == pytest.approx((0.50 + 0.78 + 0.70) / 3)
    assert measures.backward_transfer == pytest.approx(0.78 - 0.80)
    assert measures.forgetting == pytest.approx({"qqp": 0.80 - 0.78})  # STS fell, but no stage had trained it


def test_forgetting_measures_are_undefined_without_an_earlier_task():
    every_task = [{"sst", "qqp", "sts"}] * 2  # a multi-task schedule
    assert forgetting_measures([[0.4, 0.8, 0.8], [0.5, 0.8, 0.8]], ("sst", "qqp", "sts"), every_task) is None
    assert forgetting_measures([[0.4, 0.8, 0.8]], ("sst", "qqp", "sts"), [{"qqp"}]) is None
    with pytest.raises(ValueError, match="shape"):
        forgetting_measures([[0.4, 0.8]], ("sst", "qqp", "sts"), [{"qqp"}])


def test_history_forgetting_measures_read_the_stage_labels_and_skip_the_pretrained_row():
    def record(stage, sst, qqp, sts):
        return {"stage": stage, "sst_acc": sst, "qqp_acc": qqp, "sts_pearson": sts, "overall": 0.0}

    history = [record("pretrained", 0.90, 0.90, 0.90),  # above everything after it, yet no stage of R
               record("qqp", 0.20, 0.80, 0.70), record("sts", 0.25, 0.75, 0.85), record("sst", 0.50, 0.70, 0.80),
               record("qqp@0.03", 0.45, 0.78, 0.82)]
    measures = history_forgetting_measures(history)
    # Earlier tasks: sts (stage 1) and sst (stage 2); qqp@0.03 trains qqp last.
    assert measures.backward_transfer == pytest.approx(((0.82 - 0.85) + (0.45 - 0.50)) / 2)
    assert measures.forgetting == pytest.approx({"sst": 0.05, "sts": 0.03})
    annealed = [record("pretrained", 0.2, 0.6, 0.8), record("multitask-1", 0.4, 0.8, 0.8),
                record("multitask-2", 0.5, 0.8, 0.8)]
    assert history_forgetting_measures(annealed) is None
    assert "Continual-learning" not in forgetting_table_markdown(annealed)


def test_forgetting_table_rejects_incomplete_history():
    with pytest.raises(ValueError, match="history entry 1 \\(qqp\\) lacks 'sts_pearson'"):
        forgetting_table_markdown([{"stage": "qqp", "sst_acc": 0.2, "qqp_acc": 0.8}])
    with pytest.raises(ValueError, match="empty"):
        forgetting_table_markdown([])


def test_error_counts_by_hand():
    counts = error_counts(
        [2, 3, 0, 4], [2, 2, 1, 0],  # SST offsets 0, +1, -1, +4
        [1, 1, 0, 0, 1], [1, 0, 1, 0, 1],  # QQP: 2 TP, 1 FP, 1 FN, 1 TN
        [0.5, 1.0, 4.0, 5.0], [0.0, 0.5, 4.5, 5.0],  # STS: two pairs in [0, 1), two in [4, 5] (5.0 included)
    )
    assert counts["sst_offsets"] == {-4: 0, -3: 0, -2: 0, -1: 1, 0: 1, 1: 1, 2: 0, 3: 0, 4: 1}
    assert counts["qqp"] == {"true_negatives": 1, "false_positives": 1, "false_negatives": 1, "true_positives": 2,
                             "precision": 2 / 3, "recall": 2 / 3}
    assert counts["sts_bins"] == [
        {"gold": "[0, 1)", "pairs": 2, "mean_prediction": 0.75, "mean_abs_error": 0.5},
        {"gold": "[4, 5]", "pairs": 2, "mean_prediction": 4.5, "mean_abs_error": 0.25}]
    assert counts["sts_mean_prediction"] == 2.625 and counts["sts_mean_gold"] == 2.5


# --- prepare_submit ------------------------------------------------------------------------


def _write_multitask_predictions(directory):
    for (task, _split), default_path in DEFAULT_OUTPUTS.items():
        values = [0.5, 4.25] if task == "sts" else [1, 0]
        write_predictions(directory / os.path.basename(default_path), ["id1", "id2"], values, task)


def test_prepare_submit_multitask_zip(tmp_path, capsys):
    predictions_dir = tmp_path / "preds"
    _write_multitask_predictions(predictions_dir)
    out = tmp_path / "submission.zip"
    assert prepare_submit.main(["--predictions_dir", str(predictions_dir), "--out", str(out)]) == 0
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == sorted(DEFAULT_OUTPUTS.values())
        assert archive.read("predictions/sst-dev-out.csv") == (predictions_dir / "sst-dev-out.csv").read_bytes()
    assert "with 6 files" in capsys.readouterr().out


def test_prepare_submit_missing_file_is_one_line_error(tmp_path, capsys):
    predictions_dir = tmp_path / "preds"
    _write_multitask_predictions(predictions_dir)
    (predictions_dir / "sts-test-out.csv").unlink()
    out = tmp_path / "submission.zip"
    assert prepare_submit.main(["--predictions_dir", str(predictions_dir), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "sts-test-out.csv: file not found" in error
    assert os.listdir(tmp_path) == ["preds"]


def test_prepare_submit_unwritable_out_is_one_line_error(tmp_path, capsys):
    predictions_dir = tmp_path / "preds"
    _write_multitask_predictions(predictions_dir)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert prepare_submit.main(["--predictions_dir", str(predictions_dir), "--out", str(blocker / "s.zip")]) == 2
    last_line = capsys.readouterr().err.splitlines()[-1]
    assert last_line == f"error: {blocker}: cannot write there, {blocker} is a file, not a folder"


def test_prepare_submit_rejects_wrong_header(tmp_path, capsys):
    predictions_dir = tmp_path / "preds"
    _write_multitask_predictions(predictions_dir)
    (predictions_dir / "para-dev-out.csv").write_text("id,Predicted_Sentiment\na,1\n")
    args = ["--predictions_dir", str(predictions_dir), "--out", str(tmp_path / "s.zip")]
    assert prepare_submit.main(args) == 2
    assert "para-dev-out.csv: header" in capsys.readouterr().err


def test_prepare_submit_minbert_part(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in prepare_submit.MINBERT_CODE_FILES:
        (tmp_path / name).write_text("# code\n")
    csv_names = [name for name, *_ in prepare_submit.submission_predictions("minbert")]
    for name in csv_names:
        write_predictions(tmp_path / "predictions" / name, ["a", "b"], [1, 0], "sst")
    assert len(csv_names) == 8 and "finetune-cfimdb-test-out.csv" in csv_names

    assert prepare_submit.main(["--part", "minbert"]) == 0
    with zipfile.ZipFile(tmp_path / "cs224n_default_final_project_submission.zip") as archive:
        assert sorted(archive.namelist()) == sorted(
            list(prepare_submit.MINBERT_CODE_FILES) + [f"predictions/{name}" for name in csv_names]
        )

    (tmp_path / "classifier.py").unlink()
    assert prepare_submit.main(["--part", "minbert", "--out", "second.zip"]) == 2
    assert "classifier.py: file not found" in capsys.readouterr().err
    assert not (tmp_path / "second.zip").exists()


def test_kept_model_score_is_the_overall_score_of_the_trained_tasks():
    metrics = {"sst_acc": 0.48, "qqp_acc": 0.42, "sts_pearson": 0.60}
    overall = overall_score(0.48, 0.42, 0.60)
    assert kept_model_score(metrics, {"sst", "qqp", "sts"}) == pytest.approx(overall)
    assert kept_model_score(metrics, set()) == pytest.approx(overall)  # SimCSE / MLM alone: no task head trained
    assert kept_model_score(metrics, {"sst"}) == pytest.approx(0.48)
    assert kept_model_score(metrics, {"sts", "qqp"}) == pytest.approx((0.80 + 0.42) / 2)
    # A per-task SST run: epoch 3 has the best SST, epoch 1 the best overall through its untrained heads.
    epochs = [{"sst_acc": 0.4605, "qqp_acc": 0.4535, "sts_pearson": 0.6997},
              {"sst_acc": 0.4832, "qqp_acc": 0.4186, "sts_pearson": 0.6352}]
    assert max(range(2), key=lambda i: kept_model_score(epochs[i], {"sst"})) == 1
