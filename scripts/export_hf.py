"""Export a trained MultitaskBERT checkpoint for the Hugging Face ecosystem.

    python scripts/export_hf.py runs/cpu_sbert OUT_DIR [--task sts]   # the run's kept model (best), or a prefix

OUT_DIR then holds
  * the encoder as a Hugging Face BERT directory: config.json, model.safetensors under Hugging Face parameter
    names, the tokenizer files of the pretrained model it was trained from;
  * the sentence-transformers files: modules.json, sentence_bert_config.json and 1_Pooling/config.json with
    the model's pooling (mean or CLS);
  * the task heads: heads.safetensors and heads.json (the head options), which only this project reads.

So `transformers.BertModel.from_pretrained(OUT_DIR)`, `sentence_transformers.SentenceTransformer(OUT_DIR)` and
this project's `--pretrained OUT_DIR` all load the encoder. Per-task LoRA / DoRA adapters are merged into it
for the task given by --task; PALs add layers of their own and cannot be exported. Neither transformers nor
sentence-transformers is needed to export.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from base_bert import MINILM_ALIAS, CheckpointError, resolve_pretrained, to_hf_state_dict
from minbert.arguments import OneLineErrorParser
from minbert.files import (atomic_write, atomic_write_text, describe_os_error, forbidden_output, locked_folder,
                           unwritable_folder)
from minbert.model.adapters import SHARED_SET, merge_adapters
from minbert.model.checkpoint import save_tensors
from minbert.model.multitask_bert import load_multitask_checkpoint
from minbert.run.kept_model import checkpoint_prefix
from minbert.run.run_record import recorded_pretrained
from minbert.tasks import MULTITASK, task_name

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def hf_config(config: dict) -> dict:
    """Our BertConfig as a Hugging Face config.json."""
    values = {k: v for k, v in config.items() if k != "attn_implementation"}
    return {"architectures": ["BertModel"], "model_type": "bert", **values}


def recorded_metadata(checkpoint: Path) -> dict:
    """The checkpoint's JSON, read without its weights ({} when it cannot be: loading it says why, after)."""
    try:
        metadata = json.loads(checkpoint.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def pretrained_folders(checkpoint: Path, metadata: dict, pretrained: str | None) -> list[Path]:
    """The local folders of the pretrained models the export reads: the tokenizer's (--pretrained, or the one the
    checkpoint records) and the frozen base model's an adapter checkpoint loads. A Hub name that is not here yet is
    no folder of the user's."""
    names = {pretrained, recorded_pretrained(checkpoint, metadata)} - {None, ""}
    return [resolve_pretrained(name) if name == MINILM_ALIAS else Path(name) for name in names
            if name == MINILM_ALIAS or Path(name).is_dir()]


def output_problem(checkpoint: Path, out: Path, metadata: dict, pretrained: str | None) -> str | None:
    """Why OUT must not be written: the export's config.json and model.safetensors would replace a pretrained
    model's it reads (the audit's OUT = the run's --pretrained folder), its lock and clean-up would reach into
    one below it, or OUT is the folder holding the checkpoint it reads; a run's other folder is another run's."""
    problem = unwritable_folder(out) or forbidden_output("out_dir", out, own_runs=[checkpoint])
    target = out.resolve()
    for folder in pretrained_folders(checkpoint, metadata, pretrained):
        if problem is None and (target.is_relative_to(folder.resolve()) or folder.resolve().is_relative_to(target)):
            problem = f"out_dir {out}: would write over or around the pretrained model {folder}, which this " \
                      "command reads; write elsewhere"
    if problem is None and target == checkpoint.parent.resolve():
        problem = f"out_dir {out}: the folder of the checkpoint {checkpoint} it reads; export to a folder of its own"
    return problem


def task_problem(checkpoint: Path, metadata: dict, task: str | None) -> str | None:
    """Why --task would do nothing, or None: it only chooses which per-task adapters are merged."""
    heads = metadata.get("heads") if isinstance(metadata.get("heads"), dict) else {}
    adapter = heads.get("adapter") if isinstance(heads.get("adapter"), dict) else None
    if task is None or not metadata or (adapter is not None and adapter.get("sharing") == "per_task"):
        return None
    return (f"--task {task}: {checkpoint} has no per-task adapters to merge "
            f"({'no adapters' if adapter is None else 'its adapters are shared'}); leave it out")


def export(checkpoint: Path, out: Path, task: str | None = None, pretrained: str | None = None) -> None:
    """Everything is checked (the output folder, the checkpoint, the pretrained model's tokenizer files) before the
    first file is written, so a refused export leaves no half of one."""
    metadata = recorded_metadata(checkpoint)
    problem = output_problem(checkpoint, out, metadata, pretrained) or task_problem(checkpoint, metadata, task)
    if problem:
        raise CheckpointError(problem)
    model, metadata = load_multitask_checkpoint(checkpoint)
    bert = model.bert
    if model.adapter is not None:
        if model.adapter.kind == "pals":
            raise CheckpointError(f"{checkpoint}: PALs add layers of their own; a plain BERT cannot hold them")
        name = SHARED_SET if model.adapter.sharing == "shared" else task
        if name is None:
            raise CheckpointError(f"{checkpoint}: each task has its own adapters; choose one with --task "
                                  f"({', '.join(MULTITASK)})")
        bert = merge_adapters(bert, name)
    pretrained = pretrained or recorded_pretrained(checkpoint, metadata)
    if not pretrained:
        raise CheckpointError(f"{checkpoint}: does not say which pretrained model (tokenizer) it came from; "
                              "give --pretrained")
    source = resolve_pretrained(pretrained)
    tokenizer_files = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not {"vocab.txt", "tokenizer.json"} & set(tokenizer_files):
        raise CheckpointError(f"{source}: no tokenizer (vocab.txt or tokenizer.json) of {pretrained} to export with "
                              "the model; give --pretrained")
    # Every file is written aside and moved into place (files.py): an interrupted export leaves no torn file, and
    # the folder's lock keeps a second export from writing there at once (and removes what a killed one left).
    with locked_folder(out):
        atomic_write_text(out / "config.json", json.dumps(hf_config(bert.config.to_dict()), indent=2) + "\n")
        weights = {k: v.contiguous() for k, v in to_hf_state_dict(bert.state_dict()).items()}
        atomic_write(out / "model.safetensors", lambda temporary: save_tensors(weights, temporary, {"format": "pt"}))
        for name in tokenizer_files:
            atomic_write(out / name, lambda temporary, name=name: shutil.copyfile(source / name, temporary))
        max_length = metadata.get("args", {}).get("max_length", 128)
        atomic_write_text(out / "sentence_bert_config.json", json.dumps({"max_seq_length": max_length,
                                                                         "do_lower_case": False}) + "\n")
        atomic_write_text(out / "modules.json", json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]) + "\n")
        atomic_write_text(out / "1_Pooling" / "config.json", json.dumps({
            "word_embedding_dimension": bert.config.hidden_size, "pooling_mode_cls_token": model.readout.pooling == "cls",
            "pooling_mode_mean_tokens": model.readout.pooling == "mean", "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}) + "\n")
        heads = {k: v.detach().contiguous() for k, v in model.state_dict().items()
                 if not k.startswith(("bert.", "pals."))}
        atomic_write(out / "heads.safetensors", lambda temporary: save_tensors(heads, temporary))
        atomic_write_text(out / "heads.json", json.dumps(model.head_options(), indent=2) + "\n")


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a run's folder (its kept model, best) or the PREFIX of "
                        "PREFIX.safetensors + PREFIX.json (e.g. runs/x/stage_2)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--task", help="with per-task LoRA / DoRA adapters: the task whose adapters are merged")
    parser.add_argument("--pretrained", help="the model whose tokenizer to copy (default: the checkpoint's own)")
    args = parser.parse_args(argv)
    try:
        export(checkpoint_prefix(args.checkpoint), args.out_dir, task_name(args.task) if args.task else None,
               args.pretrained)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a read-only folder (files.OutputError)
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}: a Hugging Face BERT, sentence-transformers modules and heads.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
