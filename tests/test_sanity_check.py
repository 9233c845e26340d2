"""sanity_check.py: both of its checks pass on correct weights and fail on wrong ones."""
import pytest
import torch

import sanity_check

transformers = pytest.importorskip("transformers")


@pytest.fixture
def course_like_checkpoint(tmp_path):
    """A random BERT with the bert-base-uncased vocabulary size, and its outputs on the course's ids."""
    torch.manual_seed(0)
    reference = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)).eval()
    reference.save_pretrained(tmp_path / "model")
    with torch.no_grad():
        out = reference(input_ids=sanity_check.COURSE_IDS, attention_mask=sanity_check.COURSE_MASK)
    data = {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
    torch.save(data, tmp_path / "sanity_check.data")
    return tmp_path, data


def test_course_check_passes_on_matching_weights(course_like_checkpoint):
    folder, _ = course_like_checkpoint
    assert sanity_check.course_check(folder / "sanity_check.data", str(folder / "model"))


def test_course_check_fails_on_a_wrong_reference(course_like_checkpoint):
    folder, data = course_like_checkpoint
    data["pooler_output"] = data["pooler_output"] + 1e-3
    torch.save(data, folder / "sanity_check.data")
    assert not sanity_check.course_check(folder / "sanity_check.data", str(folder / "model"))


def test_course_reference_file_is_read_safely(shared_dir):
    reference = torch.load(shared_dir / "reference" / "sanity_check.data", weights_only=True)
    assert reference["last_hidden_state"].shape == (2, 8, 768)
    assert reference["pooler_output"].shape == (2, 768)


def test_oracle_check_passes_on_minilm(capsys):
    assert sanity_check.oracle_check("minilm-l6")
    assert "OK" in capsys.readouterr().out


def test_main_exit_codes(monkeypatch):
    monkeypatch.setattr(sanity_check, "oracle_check", lambda pretrained: False)
    assert sanity_check.main(["--pretrained", "minilm-l6"]) == 1
    monkeypatch.setattr(sanity_check, "oracle_check", lambda pretrained: True)
    assert sanity_check.main(["--pretrained", "minilm-l6"]) == 0


@pytest.mark.parametrize("content", [None, b"garbage, not a torch file\n", b"", "a list", "cut short", "wrong keys"])
def test_a_bad_reference_file_is_one_line_naming_it(tmp_path, capsys, content):
    """Missing, not torch's, cut short, or not the course's outputs: one line and exit code 2 (a FileNotFoundError
    or an UnpicklingError advising weights_only=False was a traceback: audit)."""
    path = tmp_path / "sanity_check.data"
    if content == "a list":
        torch.save([1, 2], path)
    elif content == "wrong keys":
        torch.save({"last_hidden_state": torch.zeros(2, 768)}, path)
    elif content == "cut short":
        torch.save({"pooler_output": torch.zeros(2, 768)}, path)
        path.write_bytes(path.read_bytes()[:300])
    elif content is not None:
        path.write_bytes(content)
    assert sanity_check.main(["--reference", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1


def test_reference_with_other_weights_is_refused(tmp_path, capsys):
    """Only bert-base-uncased runs the course check: --reference with other weights would do nothing."""
    with pytest.raises(SystemExit) as exit_:
        sanity_check.main(["--pretrained", "minilm-l6", "--reference", str(tmp_path / "sanity_check.data")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--reference would do nothing with --pretrained minilm-l6" in err and err.count("\n") == 1
