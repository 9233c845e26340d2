"""The course's datasets.py: loading the task files and batching them.

The code lives in minbert/data/batches.py (each task reads its own files: minbert/tasks/), because a top-level
module named `datasets` stands in for Hugging Face's `datasets` library wherever it is importable, so the package
and the scripts import minbert.data.batches. The names a reader of the course looks for here are these.
"""
from minbert.data.batches import (PairExample, SentenceExample, TaskData, collate_pairs, collate_sentences,
                                  load_examples, load_split, load_task_data, make_dataloader, standard_paths)

__all__ = ["PairExample", "SentenceExample", "TaskData", "collate_pairs", "collate_sentences", "load_examples",
           "load_split", "load_task_data", "make_dataloader", "standard_paths"]
