"""minbert/reports/robustness_comparison.py and scripts/compare_robustness.py: configurations' drops under the
robustness suite compared over seeds on the same examples. Hand-built predictions whose answer is known: identical
arms do not differ, a robust arm is separable from a fragile one, the bootstrap is paired (identical noisy runs
differ by exactly 0), seeds widen an interval; runs scored on other inputs are refused in one line; and the suite's
own output of two tiny runs compares end to end."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import compare_robustness
from conftest import ROOT
from minbert.reports.robustness_comparison import compare_arms, mismatch, scored_run

N = 60
GOLD = np.random.default_rng(0).integers(0, 5, N)
IDS = [f"id{i}" for i in range(N)]


def with_accuracy(accuracy: float, seed: int) -> np.ndarray:
    """SST predictions right on a random `accuracy` share of GOLD, wrong elsewhere."""
    right = np.random.default_rng(seed).permutation(N) < round(accuracy * N)
    return np.where(right, GOLD, (GOLD + 1) % 5)


def suite_row(family, variant, clean, perturbed, gold):
    """robustness.json's row of an SST variant as the suite writes it: the clean and perturbed accuracy."""
    def accuracy(predicted):
        return float(np.mean(np.asarray(predicted) == np.asarray(gold)))
    return {"task": "sst", "family": family, "variant": variant, "clean": {"value": accuracy(clean)},
            "perturbed": {"value": accuracy(perturbed)}}


def files(clean, perturbed, ids=IDS, gold=GOLD, greedy=None):
    """A run's robustness_predictions.json and robustness.json, as parsed: SST's char family, one variant (and a
    greedy row whose details are `greedy`)."""
    family = {"ids": list(ids), "gold": np.asarray(gold).tolist(), "clean": np.asarray(clean).tolist(),
              "variants": {"char_swap-0.1": np.asarray(perturbed).tolist()}}
    predictions, rows = {"sst": {"char": family}}, [suite_row("char", "char_swap-0.1", clean, perturbed, gold)]
    if greedy is not None:
        predictions["sst"]["greedy"] = {**family, "variants": {"budget=6": np.asarray(perturbed).tolist()}}
        rows.append({**suite_row("greedy", "budget=6", clean, perturbed, gold), "details": greedy})
    return predictions, {"settings": {"sets": {"seed": 0}, "attack_steps": 2}, "rows": rows}


def run(name, clean, perturbed, **kwargs):
    return scored_run(name, *files(clean, perturbed, **kwargs))


def row(result, family="char"):
    return next(found for found in result.variants if found.family == family)


def test_identical_noisy_arms_differ_by_exactly_zero_and_are_not_separable():
    noisy = run("a", with_accuracy(0.6, 1), with_accuracy(0.4, 2))
    result = compare_arms({"none": [noisy], "same": [noisy]}, replicates=500, seed=0)
    drop = row(result).drop["none"]
    assert drop.value == pytest.approx(0.2) and drop.high - drop.low > 0.1  # the examples' spread is wide
    same = row(result).minus_baseline["same"]
    assert (same.value, same.low, same.high) == (0, 0, 0) and not same.separable  # paired: it cancels exactly
    assert result.clean[0].minus_baseline["same"].low == result.clean[0].minus_baseline["same"].high == 0


def test_a_run_drops_paired_with_its_own_clean_predictions():
    unchanged = run("a", with_accuracy(0.5, 3), with_accuracy(0.5, 3))
    result = compare_arms({"none": [unchanged]}, replicates=300, seed=0)
    assert row(result).clean["none"].high - row(result).clean["none"].low > 0.1
    drop = row(result).drop["none"]
    assert (drop.value, drop.low, drop.high) == (0, 0, 0)


def test_an_arm_right_on_every_perturbed_example_is_separable_from_one_wrong_on_every_one():
    clean = with_accuracy(0.7, 4)
    fragile = [run(f"f{seed}", clean, (GOLD + 1) % 5) for seed in range(3)]
    robust = [run(f"r{seed}", clean, GOLD) for seed in range(3)]
    result = compare_arms({"none": fragile, "smart": robust}, replicates=500, seed=0)
    found = row(result)
    assert found.drop["none"].value == pytest.approx(0.7) and found.drop["smart"].value == pytest.approx(-0.3)
    assert found.drop["smart"].high <= 0
    versus = found.minus_baseline["smart"]
    assert versus.value == pytest.approx(-1.0) and versus.separable and versus.high < 0 and versus.p < 0.01
    cost = result.clean[0].minus_baseline["smart"]
    assert cost.value == 0 and not cost.separable  # the same clean predictions: no clean-score cost
    assert "smaller drop" in "\n".join(compare_robustness.markdown(result))


def test_seeds_widen_the_interval():
    steady = run("s1", with_accuracy(0.8, 5), with_accuracy(0.7, 6))
    other_seed = run("s2", with_accuracy(0.8, 5), with_accuracy(0.2, 7))  # drops 0.6, not 0.1
    result = compare_arms({"one": [steady], "two": [steady, other_seed]}, replicates=1000, seed=0)
    one, two = row(result).drop["one"], row(result).drop["two"]
    assert two.value == pytest.approx((0.1 + 0.6) / 2)
    assert two.high - two.low > 2 * (one.high - one.low)


def test_the_greedy_attacks_success_is_averaged_over_runs_and_words_pooled_over_successes():
    clean = with_accuracy(0.7, 8)
    runs = [run("g1", clean, clean, greedy={"attacked": 10, "success rate": 0.5, "words per success": 2.0}),
            run("g2", clean, clean, greedy={"attacked": 10, "success rate": 0.0, "words per success": 0.0})]
    greedy = compare_arms({"none": runs}, replicates=100, seed=0).greedy[0]
    assert greedy.success_rate["none"] == 0.25 and greedy.words_per_success["none"] == 2.0
    assert greedy.run_success_rates["none"] == [0.5, 0.0]


def test_runs_scored_on_other_inputs_are_found():
    base = run("a", GOLD, GOLD)
    cases = [(run("b", GOLD, GOLD, ids=IDS[::-1]), "b: sst char: its example ids differ (from a's)"),
             (run("b", GOLD, GOLD, gold=(GOLD + 1) % 5), "b: sst char: its gold labels differ (from a's)"),
             (scored_run("b", files(GOLD, GOLD)[0], {**files(GOLD, GOLD)[1], "settings": {"sets": {"seed": 1}}}),
              "b: its sets setting differs ({'seed': 1}, not {'seed': 0}) (from a's)"),
             (scored_run("b", {}, {**files(GOLD, GOLD)[1], "rows": []}), "b: its tasks are none, not sst (from a's)"),
             (run("b", GOLD, GOLD, greedy=dict.fromkeys(("attacked", "success rate", "words per success"), 1)),
              "b: its sst families are char, greedy, not char (from a's)")]
    for other, problem in cases:
        assert mismatch([base, other]) == problem
    assert mismatch([base, run("c", with_accuracy(0.1, 9), GOLD)]) is None  # other predictions, same inputs
    with pytest.raises(ValueError, match="a greedy row without attacked, success rate, words per success"):
        run("x", GOLD, GOLD, greedy={"attacked": 4})
    with pytest.raises(ValueError, match="sst char clean: expected 60 numbers"):
        scored_run("x", {"sst": {"char": {"ids": IDS, "gold": GOLD.tolist(), "clean": [1], "variants": {}}}}, {})


def write_folder(folder, predictions, report):
    folder.mkdir(parents=True)
    (folder / "robustness_predictions.json").write_text(json.dumps(predictions))
    (folder / "robustness.json").write_text(json.dumps(report))
    return folder


def test_the_script_refuses_mismatched_ids_in_one_line_exit_2(tmp_path):
    first = write_folder(tmp_path / "a", *files(GOLD, GOLD))
    moved = write_folder(tmp_path / "b", *files(GOLD, GOLD, ids=[f"x{i}" for i in range(N)]))
    done = subprocess.run([sys.executable, "scripts/compare_robustness.py", f"none={first}", f"smart={moved}"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: {moved}: sst char: its example ids differ (from {first}'s)"]


def test_a_folder_without_predictions_is_refused_in_one_line(tmp_path, capsys):
    first = write_folder(tmp_path / "a", *files(GOLD, GOLD))
    (first / "robustness_predictions.json").unlink()
    assert compare_robustness.main([f"none={first}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "robustness_predictions.json: file not found (scored before" in lines[0]


@pytest.mark.parametrize("where", ["the first arm's folder", "the second arm's folder", "a run's folder"])
def test_the_output_never_replaces_an_inputs_or_a_runs_files(tmp_path, capsys, where):
    """--output FILE.md writes FILE.json too: neither may land in a folder it reads (replacing an arm's
    robustness.json) or in a run's folder; refused in one line before anything is written."""
    first = write_folder(tmp_path / "a", *files(GOLD, GOLD))
    second = write_folder(tmp_path / "b" / "robustness", *files(GOLD, GOLD))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "args.json").write_text("{}")
    output = {"the first arm's folder": first / "robustness.md", "the second arm's folder": second / "robustness.md",
              "a run's folder": tmp_path / "c" / "compare.md"}[where]
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert compare_robustness.main([f"none={first}", f"smart={tmp_path / 'b'}", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --output {output}") and err.count("\n") == 1
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_two_tiny_runs_scored_by_the_suite_compare_end_to_end(tmp_path, tiny_checkpoint, capsys):
    import robustness
    from test_robustness import SCRIPT_FLAGS, tiny_run
    first, second = tiny_run(tmp_path / "a", tiny_checkpoint, 1), tiny_run(tmp_path / "b", tiny_checkpoint, 2)
    flags = [*SCRIPT_FLAGS, "--tasks", "sst,sts"]
    assert robustness.main([str(first), *flags]) == 0
    sets = first / "robustness" / "perturbed"
    assert robustness.main([str(second), "--perturbed_dir", str(sets), *flags]) == 0
    capsys.readouterr()  # the suite's own tables
    output = tmp_path / "study" / "compare.md"
    assert compare_robustness.main([f"a={first}", f"b={second / 'robustness'}", "--replicates", "200",
                                    "--output", str(output)]) == 0
    assert capsys.readouterr().out == output.read_text()
    estimates = json.loads(output.with_suffix(".json").read_text())
    for name, folder in (("a", first), ("b", second)):
        suite = json.loads((folder / "robustness" / "robustness.json").read_text())["rows"]
        assert len(suite) == len(estimates["variants"]) == 2 * (7 + 2 + 1)
        for ours, theirs in zip(estimates["variants"], suite):  # one run an arm: its own scores
            assert (ours["task"], ours["family"], ours["variant"]) == (theirs["task"], theirs["family"],
                                                                        theirs["variant"])
            for key in ("clean", "perturbed", "drop"):
                assert ours[key][name]["value"] == pytest.approx(theirs[key]["value"], abs=1e-12)
            assert "predictions" not in theirs
    assert {row["family"] for row in estimates["clean"]} == {"char", "word", "embedding", "greedy"}
    assert [row["task"] for row in estimates["greedy"]] == ["sst", "sts"]
    table = output.read_text()
    assert "| SST acc | char | char_swap-0.2 | 20 |" in table and "| b - a |" in table
    assert "| SST acc | char, word | 20 |" in table  # the same clean predictions: one line


def test_an_arm_gives_each_run_once(tmp_path, capsys):
    first = write_folder(tmp_path / "a", *files(GOLD, GOLD))
    with pytest.raises(SystemExit) as exit_info:  # the same folder, spelled another way
        compare_robustness.main([f"none={first},{tmp_path / '.' / 'a'}"])
    assert exit_info.value.code == 2 and f"is the same run as {first}; give each run once" in capsys.readouterr().err


def test_the_primary_row_is_decided_over_the_seeds_first_and_the_rest_is_holm_corrected(tmp_path, capsys):
    def arm(name, perturbed):
        return f"{name}=" + ",".join(str(write_folder(tmp_path / f"{name}{seed}", *files(GOLD, perturbed(seed))))
                                     for seed in range(4))
    arms = [arm("none", lambda seed: with_accuracy(0.5, seed)), arm("smart", lambda seed: GOLD),
            arm("lnsr", lambda seed: GOLD)]
    assert compare_robustness.main([*arms, "--replicates", "200", "--primary", "sst/char/char_swap-0.1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 4 runs against 4, each none run's drop 0.5 and each smart run's 0: the most extreme 2 of C(8, 4) = 70 splits
    assert lines[2].startswith("Primary comparison (declared: --primary sst/char/char_swap-0.1;")
    assert lines[2].endswith("smart - none, the drop on sst/char/char_swap-0.1 (4 against 4 runs): "
                             "-0.500 [-0.500, -0.500], exact p 0.029, smaller drop.")
    assert "Secondary comparisons: a family of 3, Holm-corrected" in lines[6]  # lnsr's drop, both clean scores
    drops = next(line for line in lines if line.startswith("| SST acc | char | char_swap-0.1 |"))
    assert drops.endswith("| -0.500 [-0.567, -0.417], p 0.000, primary (above) | -0.500 [-0.567, -0.417], p 0.000, "
                          "Holm p 0.000, survives (smaller drop) |")  # a bootstrap over the examples too
    clean = next(line for line in lines if line.startswith("| SST acc | char | 60 |"))
    assert clean.endswith("p 1.000, Holm p 1.000, not separable |")


@pytest.mark.parametrize("primary, problem", [
    ("sst/char/nope", "no row sst/char/nope in {first}'s results (its rows: sst/char/char_swap-0.1)"),
    ("sst/char", "--primary: 'sst/char' is not TASK/FAMILY/VARIANT"),
    ("none:sst/char/char_swap-0.1", "--primary: 'none' is not one of the later arms (smart)"),
])
def test_an_impossible_primary_row_is_refused_in_one_line(tmp_path, capsys, primary, problem):
    runs = [write_folder(tmp_path / f"run{i}", *files(GOLD, GOLD)) for i in range(4)]
    argv = [f"none={runs[0]},{runs[1]}", f"smart={runs[2]},{runs[3]}", "--primary", primary]
    try:
        assert compare_robustness.main(argv) == 2
    except SystemExit as refused:
        assert refused.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem.format(first=runs[0]) in lines[0]


def test_a_runs_results_must_be_its_own(tmp_path, tiny_checkpoint, capsys):
    """A run's results record the weights they scored (the checkpoint's SHA-256), and their rows the scores of their
    predictions: a predictions file copied from another run's results, or both files, are refused in one line; a copy
    of the run's whole folder compares as the run."""
    import shutil
    import robustness
    from test_robustness import SET_FLAGS, tiny_run
    first, second = tiny_run(tmp_path / "a", tiny_checkpoint, 1), tiny_run(tmp_path / "b", tiny_checkpoint, 2)
    flags = [*SET_FLAGS, "--tasks", "sst,sts", "--families", "char"]
    assert robustness.main([str(first), *flags]) == 0
    assert robustness.main([str(second), "--perturbed_dir", str(first / "robustness" / "perturbed"), *flags]) == 0
    settings = json.loads((first / "robustness" / "robustness.json").read_text())["settings"]
    assert settings["checkpoint_sha256"] == json.loads((first / "best.json").read_text())["sha256"]
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)
    capsys.readouterr()
    assert compare_robustness.main([f"a={copy}", f"b={second}", "--replicates", "100"]) == 0
    capsys.readouterr()
    results, theirs = copy / "robustness", second / "robustness"
    shutil.copy(theirs / "robustness_predictions.json", results)
    assert compare_robustness.main([f"a={copy}", f"b={second}", "--replicates", "100"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {results}: robustness_predictions.json: sst/char/")
    assert "they are not the predictions that row was scored from (another run's?)" in lines[0]
    shutil.copy(theirs / "robustness.json", results)
    assert compare_robustness.main([f"a={copy}", f"b={second}", "--replicates", "100"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {results / 'robustness.json'}: scored {second / 'best'}, not the run {copy} it lies in (its "
        "best.json holds other weights, or none): another run's results, or this run's before it was trained again; "
        "score it again"]


def sts_files(clean, perturbed):
    """robustness_predictions.json and robustness.json of STS's char family, one variant, GOLD as 0-5 scores."""
    gold = GOLD.astype(float)
    predictions = {"sts": {"char": {"ids": IDS, "gold": gold.tolist(), "clean": list(clean),
                                    "variants": {"char_swap-0.1": list(perturbed)}}}}
    row = {"task": "sts", "family": "char", "variant": "char_swap-0.1",
           **{part: {"value": float(np.corrcoef(values, gold)[0, 1])} for part, values in (("clean", clean),
                                                                                          ("perturbed", perturbed))}}
    return predictions, {"settings": {}, "rows": [row]}


@pytest.mark.parametrize("task, where, value, problem", [
    ("sst", "clean", 7, "sst char clean: 7 is not an integer 0-4"),
    ("sst", "char_swap-0.1", 2.5, "sst char char_swap-0.1: 2.5 is not an integer 0-4"),
    ("sst", "gold", -1, "sst char gold: -1 is not an integer 0-4"),
    ("sts", "clean", float("nan"), "sts char clean: nan is not a finite number"),
    ("sts", "char_swap-0.1", float("inf"), "sts char char_swap-0.1: inf is not a finite number"),
    ("sts", "char_swap-0.1", 1e300, "sts char char_swap-0.1: STS score 1e+300 is outside 0-5"),
])
def test_values_no_run_predicts_are_refused_in_one_line(tmp_path, capsys, task, where, value, problem):
    """A class outside the task's, a score outside STS's 0-5, a NaN or an infinity (JSON as Python reads it takes
    them) would be scored as any prediction: a NaN made STS's r 0."""
    predictions, report = files(GOLD, GOLD) if task == "sst" else sts_files(GOLD * 0.9, GOLD * 0.8)
    family = predictions[task]["char"]
    (family["variants"][where] if where.startswith("char") else family[where])[0] = value
    folder = write_folder(tmp_path / "a", predictions, report)
    assert compare_robustness.main([f"none={folder}", "--replicates", "100"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {folder}: robustness_predictions.json: {problem}"]


def test_the_output_is_a_markdown_file_and_an_arm_is_not_compared_with_itself(tmp_path, capsys):
    first = write_folder(tmp_path / "a", *files(GOLD, GOLD))
    for argv, problem in (([f"none={first}", "--output", str(tmp_path / "study.txt")],
                           f"--output: {tmp_path / 'study.txt'} is not a .md file; name FILE.md (every estimate goes "
                           "to FILE.json)"),
                          ([f"none={first}", f"same={tmp_path / '.' / 'a'}"],
                           "arms: same names the same runs as none; an arm compared with itself differs by exactly 0")):
        with pytest.raises(SystemExit) as exit_info:
            compare_robustness.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and problem in err and err.count("\n") == 1
    assert not (tmp_path / "study.txt").exists()
