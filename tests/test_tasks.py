"""minbert/tasks/: one module per task, found by the package; one internal name per task, the course's names
(quora files, para flags) mapped by each task's fields."""
import dataclasses
import re
import sys

import pytest

import minbert.tasks as tasks
from conftest import DEMO, tiny_model
from minbert.tasks import (MULTITASK, PART1_TASKS, RUN_TASKS, SIMCSE_TASKS, SPLITS, TASKS, course_file_name, data_flag,
                           default_output, output_flag, task_name)
from minbert.tasks.base import Task
from minbert.tasks.classification import SentenceClassification, SentenceClassifierModel
from minbert.tasks.registry import TaskModuleError, check_task_modules

COURSE_DATA_FLAGS = {"sst_train", "sst_dev", "sst_test", "para_train", "para_dev", "para_test",
                     "sts_train", "sts_dev", "sts_test"}
COURSE_OUTPUT_FLAGS = {"sst_dev_out", "sst_test_out", "para_dev_out", "para_test_out", "sts_dev_out", "sts_test_out"}


@pytest.mark.parametrize("name, internal", [("qqp", "qqp"), ("quora", "qqp"), ("para", "qqp"), (" QQP ", "qqp"),
                                            ("Quora", "qqp"), ("sst", "sst"), ("sts", "sts")])
def test_course_names_are_aliases_of_the_internal_one(name, internal):
    assert task_name(name) == internal


@pytest.mark.parametrize("name", ["mnli", "", "paraphrase", "sst5"])
def test_unknown_task_names_the_allowed_ones(name):
    with pytest.raises(ValueError, match=f"unknown task {name!r}; use one of sst, qqp, sts"):
        task_name(name)


def test_cfimdb_is_a_task_only_where_allowed():
    with pytest.raises(ValueError, match="unknown task 'cfimdb'"):
        task_name("cfimdb")
    assert task_name("cfimdb", allowed=("sst", "cfimdb")) == "cfimdb"
    with pytest.raises(ValueError, match="use one of sst, cfimdb"):
        task_name("qqp", allowed=("sst", "cfimdb"))


def test_the_table():
    assert MULTITASK == ("sst", "qqp", "sts") and set(TASKS) == {"sst", "qqp", "sts", "cfimdb", "qa"}
    assert [TASKS[t].is_pair for t in ("sst", "qqp", "sts", "cfimdb")] == [False, True, True, False]
    assert {t: TASKS[t].label_column for t in TASKS} == {"sst": "sentiment", "qqp": "is_duplicate",
                                                         "sts": "similarity", "cfimdb": "sentiment", "qa": "answers"}
    assert [t for t in TASKS if TASKS[t].test_file_optional] == ["qa"] and RUN_TASKS == (*MULTITASK, "qa")
    assert [t for t in TASKS if TASKS[t].plots_embeddings] == ["sst"] and SIMCSE_TASKS == ("sts",)
    assert task_name("squad", RUN_TASKS) == "qa"
    assert {t: TASKS[t].leaderboard_column for t in MULTITASK} == {
        "sst": "Predicted_Sentiment", "qqp": "Predicted_Is_Paraphrase", "sts": "Predicted_Similarity"}


def test_course_file_names():
    assert course_file_name("qqp", "test") == "quora-test-student.csv"
    assert course_file_name("qqp", "train") == "quora-train.csv"
    assert course_file_name("sst", "dev") == "ids-sst-dev.csv"
    assert course_file_name("cfimdb", "test") == "ids-cfimdb-test-student.csv"
    assert course_file_name("sts", "train") == "sts-train.csv"
    for task in MULTITASK:
        for split in SPLITS:
            assert (DEMO / course_file_name(task, split)).is_file()


def test_course_flag_and_output_names():
    assert {data_flag(t, s) for t in MULTITASK for s in SPLITS} == COURSE_DATA_FLAGS
    assert {output_flag(t, s) for t in MULTITASK for s in ("dev", "test")} == COURSE_OUTPUT_FLAGS
    assert data_flag("qqp", "train") == "para_train" and output_flag("qqp", "dev") == "para_dev_out"
    assert default_output("qqp", "dev") == "predictions/para-dev-out.csv"
    assert default_output("sst", "test") == "predictions/sst-test-out.csv"
    assert data_flag("cfimdb", "dev") == "cfimdb_dev"
    assert [course_file_name("qa", s) for s in SPLITS] == ["train-v2.0.json", "dev-v2.0.json", "test-v2.0.json"]
    assert data_flag("qa", "train") == "squad_train" and default_output("qa", "test") == "predictions/squad-test-out.json"


def test_training_arguments_per_file_flags_are_those_of_the_table():
    from minbert.run.training_args import TrainingArguments, build_parser
    parser = build_parser(TrainingArguments)
    flags = {option[2:] for action in parser._actions for option in action.option_strings}
    per_file = {f for f in flags if f.endswith(("_train", "_dev", "_test", "_out"))} - {"score_train"}  # a switch
    squad_flags = {"squad_train", "squad_dev", "squad_test", "squad_dev_out", "squad_test_out"}
    assert per_file == COURSE_DATA_FLAGS | COURSE_OUTPUT_FLAGS | squad_flags
    defaults = parser.parse_args([])
    # unset: OUTPUT_DIR/<the course's name> (prediction_paths)
    assert all(getattr(defaults, flag) is None for flag in COURSE_OUTPUT_FLAGS | {"squad_dev_out", "squad_test_out"})
    assert {action.dest: action.help for action in parser._actions if action.dest in COURSE_OUTPUT_FLAGS} == {
        output_flag(t, s): f"default: OUTPUT_DIR/{default_output(t, s)}" for t in MULTITASK for s in ("dev", "test")}
    assert all(getattr(defaults, flag) is None for flag in COURSE_DATA_FLAGS)  # DATA_DIR/<course name>


def test_other_modules_read_the_table():
    from evaluation import DEFAULT_OUTPUTS, LEADERBOARD_COLUMNS
    from minbert.data.batches import standard_paths
    assert {key: path.name for key, path in standard_paths("d").items()} == {
        (t, s): course_file_name(t, s) for t in TASKS for s in SPLITS}
    assert DEFAULT_OUTPUTS == {(t, s): default_output(t, s) for t in MULTITASK for s in ("dev", "test")}
    assert {t: LEADERBOARD_COLUMNS[t] for t in MULTITASK} == {t: TASKS[t].leaderboard_column for t in MULTITASK}


def test_every_task_module_of_the_folder_is_found_and_ordered_by_its_fields():
    assert list(TASKS) == ["sst", "qqp", "sts", "cfimdb", "qa"]  # their `order`
    assert all(isinstance(task, Task) and sys.modules[type(task).__module__] for task in TASKS.values())
    assert {name: type(task).__module__ for name, task in TASKS.items() if type(task).__module__ != f"minbert.tasks.{name}"} \
        == {"cfimdb": "minbert.tasks.classification"}  # a SentenceClassification, in cfimdb.py
    assert (MULTITASK, RUN_TASKS, PART1_TASKS) == (("sst", "qqp", "sts"), ("sst", "qqp", "sts", "qa"), ("sst", "cfimdb"))
    assert tasks.cfimdb.TASK is TASKS["cfimdb"] and tasks.qa.TASK is TASKS["qa"]


TOY = dataclasses.replace(TASKS["cfimdb"], name="toy", aliases=(), order=99, part1=False, title="Toy",
                          flag_prefix="toy", head_name="toy_head")  # owns nothing another task does


class BorrowedMetricKeys(SentenceClassifierModel):
    history_columns = (("toy_f1", "Toy F1"), ("qqp_acc", "QQP acc"))  # QQP's accuracy key


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class BorrowsMetricKeys(SentenceClassification):
    model_part = BorrowedMetricKeys


def the_tasks_with(task, file="minbert/tasks/toy.py") -> dict[str, object]:
    """The real task modules' TASKs and `task` as `file`'s."""
    return {**{f"minbert/tasks/{name}.py": existing for name, existing in TASKS.items()}, file: task}


def test_the_real_tasks_and_a_new_one_claiming_nothing_of_theirs_pass_the_check():
    checked = check_task_modules(the_tasks_with(dataclasses.replace(TOY, aliases=("toy", "TOY"))))  # its own, twice
    assert list(checked) == [*TASKS, "toy"] and checked["toy"].aliases == ("toy", "TOY")


@pytest.mark.parametrize("field, value, message", [
    ("name", "qqp", "its name 'qqp' is already minbert/tasks/qqp.py's"),
    ("aliases", ("para",), "its name 'para' is already minbert/tasks/qqp.py's"),
    # As the command line reads a name: otherwise 'Quora' would silently never pick this task.
    ("aliases", (" Quora",), "its name 'quora' is already minbert/tasks/qqp.py's"),
    # scores/QQP-dev.csv and scores/qqp-dev.csv are one file on a case-insensitive filesystem.
    ("name", "QQP", "its name 'qqp' is already minbert/tasks/qqp.py's"),
    ("order", 2, "its order 2 is already minbert/tasks/sts.py's"),
    ("title", "SST", "its title 'SST' is already minbert/tasks/sst.py's"),
    ("flag_prefix", "para", "its flag '--para_train' is already minbert/tasks/qqp.py's"),
    # Other flags (--PARA_dev_out) but the same leaderboard files on a case-insensitive filesystem.
    ("flag_prefix", "PARA", "its leaderboard file 'para-dev-out.csv' is already minbert/tasks/qqp.py's"),
    ("head_name", "sentiment_head", "its head 'sentiment_head' is already minbert/tasks/sst.py's")])
def test_a_task_claiming_another_tasks_resource_is_refused_naming_both_files(field, value, message):
    with pytest.raises(TaskModuleError, match=rf"^minbert/tasks/toy.py: {message}; two tasks cannot share it$"):
        check_task_modules(the_tasks_with(dataclasses.replace(TOY, **{field: value})))


def test_a_task_claiming_another_tasks_metric_key_is_refused():
    toy = BorrowsMetricKeys(**{f.name: getattr(TOY, f.name) for f in dataclasses.fields(TOY) if f.init})
    with pytest.raises(TaskModuleError, match=r"^minbert/tasks/toy.py: its metric key 'qqp_acc' is already "
                                              r"minbert/tasks/qqp.py's"):
        check_task_modules(the_tasks_with(toy))


def test_whichever_module_comes_first_both_files_are_named():
    modules = {"minbert/tasks/aaa.py": dataclasses.replace(TOY, head_name="paraphrase_head"), **the_tasks_with(TOY)}
    with pytest.raises(TaskModuleError, match=r"^minbert/tasks/qqp.py: its head 'paraphrase_head' is already "
                                              r"minbert/tasks/aaa.py's"):
        check_task_modules(modules)


@pytest.mark.parametrize("task, kind", [({"name": "toy"}, "dict"), (None, "NoneType"),
                                        (SentenceClassification, "type")])  # the class, not a task of it
def test_a_module_whose_task_is_not_a_task_is_refused(task, kind):
    with pytest.raises(TaskModuleError, match=rf"^minbert/tasks/toy.py: its TASK is a {kind}, not a task "):
        check_task_modules(the_tasks_with(task))


def test_the_package_checks_every_module_of_the_folder_when_discovering(tmp_path, monkeypatch):
    (tmp_path / "toy.py").write_text("import dataclasses\nfrom minbert.tasks.cfimdb import TASK as CFIMDB\n"
                                     "TASK = dataclasses.replace(CFIMDB, name='toy', order=99, title='Toy')\n")
    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    try:
        with pytest.raises(TaskModuleError, match=r"^minbert/tasks/toy.py: its flag '--cfimdb_train' is already "
                                                  r"minbert/tasks/cfimdb.py's"):
            tasks._discover()
    finally:
        sys.modules.pop("minbert.tasks.toy", None)


def test_a_task_flag_spelled_as_a_command_line_flag_is_refused_in_one_line(monkeypatch, capsys):
    """The registry sees the tasks only; a per-file flag taking the command line's own (here --score_train) is
    refused where the parser is built, in one line naming the task's file, not argparse's conflict traceback."""
    from minbert.run.training_args import build_parser, flag, per_file_options
    monkeypatch.setitem(TASKS, "toy", dataclasses.replace(TOY, flag_prefix="score"))
    monkeypatch.setitem(tasks.TASK_FILES, "toy", "minbert/tasks/toy.py")

    @dataclasses.dataclass
    class Arguments:
        data_files: dict = per_file_options("data", ("toy",))
        score_train: bool = flag(False, "also write the train scores", action="store_true")

    with pytest.raises(SystemExit) as stopped:
        build_parser(Arguments)
    assert stopped.value.code == 2
    assert re.fullmatch(r"(\S+): error: minbert/tasks/toy.py: its flag --score_train is already \1's own\n",
                        capsys.readouterr().err)


def test_each_task_writes_and_reads_back_its_leaderboard_cells():
    assert [TASKS["sst"].outputs.format_prediction(v) for v in (0, 4.0)] == ["0", "4"]
    assert TASKS["sts"].outputs.format_prediction(1.23456789) == "1.23457" and TASKS["sts"].outputs.parse_prediction(" 2.5") == 2.5
    for task, bad in (("sst", 5), ("qqp", 0.5), ("cfimdb", 2), ("sts", float("nan"))):
        with pytest.raises(ValueError):
            TASKS[task].outputs.format_prediction(bad)
    with pytest.raises(ValueError, match="official JSON"):
        TASKS["qa"].outputs.format_prediction("an answer")


def test_kept_scores_are_on_0_to_1():
    metrics = {"sst_acc": 0.5, "qqp_acc": 0.75, "sts_pearson": -0.2, "qa_f1": 0.6}
    assert [TASKS[t].model.kept_score(metrics) for t in RUN_TASKS] == [0.5, 0.75, pytest.approx(0.4), 0.6]
    assert dataclasses.replace(TASKS["sts"], name="sim").model.score_key == "sim_pearson"


@pytest.mark.parametrize("head_name", ["bert", "dropout", "forward"])
def test_a_head_named_like_one_of_the_models_attributes_is_refused(monkeypatch, head_name):
    import minbert.model.multitask_bert as multitask_bert
    monkeypatch.setitem(multitask_bert.TASKS, "sst", dataclasses.replace(TASKS["sst"], head_name=head_name))
    with pytest.raises(ValueError, match=rf"^task 'sst': its head_name '{head_name}' is already an attribute of "
                                         "MultitaskBERT"):
        tiny_model()


def test_a_classification_naming_another_number_of_classes_is_refused():
    """predict.py shows a class by its name: a name short would fail at prediction time, not where it is declared."""
    with pytest.raises(TaskModuleError, match=r"^minbert/tasks/toy.py: its task names 2 classes \(label_names\) "
                                              r"but has 5$"):
        check_task_modules(the_tasks_with(dataclasses.replace(TOY, num_classes=5, label_names=("bad", "good"))))
