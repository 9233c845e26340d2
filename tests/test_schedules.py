"""schedules.py: the stage syntax, whole schedules, the task order of multi-task epochs, the learning rate."""
import random
from collections import Counter

import pytest

from minbert.reports.tables import tasks_trained_by
from minbert.training.schedules import (Stage, StageKind, annealed_probabilities, build_schedule, learning_rate_factor,
                                        multitask_order, parse_stage_list, train_tasks, trained_heads)


def test_mlm_stages_parse_with_fractions_and_repeats():
    stages = parse_stage_list("mlm:0.5, mlm*2, qqp")
    assert stages == [Stage(StageKind.MLM, fraction=0.5), Stage(StageKind.MLM), Stage(StageKind.MLM),
                      Stage(StageKind.TASK, "qqp")]
    assert [s.label for s in stages] == ["mlm@0.5", "mlm", "mlm", "qqp"]


def test_parse_stage_list_fractions_repeats_and_aliases():
    stages = parse_stage_list("qqp, sts*2 ,quora:0.03,para:0.5*2, sst")
    assert stages == [Stage(StageKind.TASK, "qqp"), Stage(StageKind.TASK, "sts"), Stage(StageKind.TASK, "sts"),
                      Stage(StageKind.TASK, "qqp", 0.03), Stage(StageKind.TASK, "qqp", 0.5),
                      Stage(StageKind.TASK, "qqp", 0.5),
                      Stage(StageKind.TASK, "sst")]
    assert [s.label for s in stages[:4]] == ["qqp", "sts", "sts", "qqp@0.03"]
    assert parse_stage_list("") == []


@pytest.mark.parametrize("text, problem", [
    ("qqp,mnli", "unknown stage 'mnli'"), ("sts:0", "fraction"), ("sts:1.5", "fraction"),
    ("sts:half", "task\\[:fraction\\]"), ("sts*0", "repeat count"), ("sts*two", "task\\[:fraction\\]"),
    ("cfimdb", "unknown stage 'cfimdb'"),
])
def test_parse_stage_list_errors(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_stage_list(text)


def test_build_schedule_sequential_simcse_and_multitask():
    assert [s.label for s in build_schedule("sequential", "qqp", "sts,sst:0.5", 2)] == \
        ["qqp", "sts", "sst@0.5", "sts", "sst@0.5"]
    kinds = [s.kind for s in build_schedule("sequential", "", "sts", 1, simcse_epochs=2)]
    assert kinds == [StageKind.SIMCSE, StageKind.SIMCSE, StageKind.TASK]
    assert build_schedule("annealed", epochs=3) == [Stage(StageKind.MULTITASK, epoch=e) for e in (1, 2, 3)]
    assert [s.label for s in build_schedule("annealed", epochs=2, simcse_epochs=1, mlm_epochs=1)] == \
        ["mlm", "simcse", "multitask-1", "multitask-2"]
    assert [s.label for s in build_schedule("round_robin", "qqp", "sts", 5, epochs=2, simcse_epochs=1)] == \
        ["simcse", "multitask-1", "multitask-2"]  # the sequential stages do not apply
    with pytest.raises(ValueError, match="schedule is empty"):
        build_schedule("sequential", "", "sts", 0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        build_schedule("random", "qqp")


def test_annealed_probabilities_go_from_size_proportional_to_near_uniform():
    sizes = {"sst": 8544, "qqp": 283003, "sts": 6040}
    first, last = annealed_probabilities(sizes, 1, 5), annealed_probabilities(sizes, 5, 5)
    for probabilities, alpha in ((first, 1.0), (last, 0.2)):
        assert sum(probabilities.values()) == pytest.approx(1.0)
        total = sum(n ** alpha for n in sizes.values())
        for task, n in sizes.items():
            assert probabilities[task] == pytest.approx(n ** alpha / total)
    middle = annealed_probabilities(sizes, 3, 5)
    assert last["qqp"] < middle["qqp"] < first["qqp"]
    assert annealed_probabilities(sizes, 1, 1) == pytest.approx(first)


def test_multitask_order_round_robin_takes_the_tasks_in_turn():
    sizes = {"sst": 10, "qqp": 1000, "sts": 5}
    assert multitask_order("round_robin", sizes, 1, 3, 7, random.Random(0)) == \
        ["sst", "qqp", "sts", "sst", "qqp", "sts", "sst"]


def test_multitask_order_annealed_draws_with_the_annealed_probabilities():
    sizes = {"sst": 100, "qqp": 800, "sts": 100}
    order = multitask_order("annealed", sizes, 1, 3, 4000, random.Random(0))
    assert order == multitask_order("annealed", sizes, 1, 3, 4000, random.Random(0))  # seeded
    counts = Counter(order)
    assert counts["qqp"] / 4000 == pytest.approx(0.8, abs=0.03)
    last = Counter(multitask_order("annealed", sizes, 3, 3, 4000, random.Random(0)))
    assert last["qqp"] < counts["qqp"]
    with pytest.raises(ValueError, match="sequential"):
        multitask_order("sequential", sizes, 1, 1, 3, random.Random(0))


def test_train_tasks_of_a_schedule():
    assert train_tasks(parse_stage_list("qqp,sts:0.5")) == {"qqp", "sts"}
    assert train_tasks(parse_stage_list("mlm:0.5,sts")) == {"sst", "qqp", "sts"}  # mlm reads every train set
    assert train_tasks([Stage(StageKind.SIMCSE)]) == set()
    assert train_tasks([Stage(StageKind.SIMCSE), Stage(StageKind.MULTITASK, epoch=1)]) == {"sst", "qqp", "sts"}


# ---------------------------------------------------------------------------------------------------
# The learning rate


def test_constant_learning_rate_factor_is_1():
    assert [learning_rate_factor(u, 7) for u in range(7)] == [1.0] * 7
    assert learning_rate_factor(3, 7, "constant", 0.5) == 1.0


def test_linear_warmup_then_decay_by_hand():
    # 20 updates, warm-up int(0.1 * 20) = 2: (u + 1) / 3 while u < 2, then (20 - u) / 18.
    factors = [learning_rate_factor(u, 20, "linear", 0.1) for u in range(20)]
    expected = [1 / 3, 2 / 3] + [(20 - u) / 18 for u in range(2, 20)]
    assert factors == pytest.approx(expected, rel=1e-12)
    assert factors[2] == 1.0 and max(factors) == 1.0  # the peak, right after the warm-up
    assert all(a < b for a, b in zip(factors[:2], factors[1:3]))  # rises
    assert all(a > b for a, b in zip(factors[2:], factors[3:]))  # then falls
    assert factors[-1] == pytest.approx(1 / 18) and learning_rate_factor(20, 20, "linear", 0.1) == 0.0


def test_linear_without_warmup_starts_at_the_peak():
    # 10 updates, warm-up int(0.05 * 10) = 0: (10 - u) / 10.
    assert [learning_rate_factor(u, 10, "linear", 0.05) for u in range(10)] == \
        pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])


def test_linear_schedule_for_a_long_run_ends_near_0():
    total = 10_000
    factors = [learning_rate_factor(u, total, "linear", 0.1) for u in range(total)]
    assert factors[0] == pytest.approx(1 / 1001) and factors[999] == pytest.approx(1000 / 1001)
    assert factors[1000] == 1.0 and factors[-1] == pytest.approx(1 / 9000) and min(factors) > 0


def test_unknown_learning_rate_schedule():
    with pytest.raises(ValueError, match="learning-rate schedule"):
        learning_rate_factor(0, 10, "cosine")


def test_trained_heads_are_those_whose_heads_the_stages_train():
    assert trained_heads(parse_stage_list("sst*3")) == {"sst"}
    assert trained_heads(parse_stage_list("qqp,sts,sst,qqp:0.03")) == {"sst", "qqp", "sts"}
    assert trained_heads([Stage(StageKind.SIMCSE), *parse_stage_list("sts")]) == {"sts"}
    assert trained_heads([Stage(StageKind.MLM), Stage(StageKind.MULTITASK, epoch=1)]) == {"sst", "qqp", "sts"}
    assert trained_heads([Stage(StageKind.SIMCSE)]) == set()


def test_tasks_trained_by_a_stage_label():
    tasks = ("sst", "qqp", "sts")
    assert tasks_trained_by("qqp", tasks) == {"qqp"} and tasks_trained_by("qqp@0.03", tasks) == {"qqp"}
    assert tasks_trained_by("multitask-2", tasks) == {"sst", "qqp", "sts"}
    for label in ("mlm", "mlm@0.5", "simcse", "pretrained", "qa"):
        assert tasks_trained_by(label, tasks) == set()
    assert {stage.label for stage in parse_stage_list("qqp,sts:0.5,mlm")} == {"qqp", "sts@0.5", "mlm"}


def test_every_kind_of_stage_label_reads_back_as_the_heads_its_stage_trains():
    """Stage.label writes the labels a history holds and reports/tables.py reads them (the reports layer is below
    training): the two agree on every kind of stage."""
    tasks = ("sst", "qqp", "sts")
    stages = [*build_schedule("sequential", "mlm:0.5,qqp,sts:0.5*2", "sst", 1, simcse_epochs=1, tasks=tasks),
              *build_schedule("annealed", epochs=2, tasks=tasks)]
    assert {stage.kind for stage in stages} == set(StageKind)
    for stage in stages:
        assert tasks_trained_by(stage.label, tasks) == trained_heads([stage], tasks), stage.label
