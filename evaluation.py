"""The course's evaluation.py: the tasks' metrics as a run records them, the overall score, leaderboard prediction
files, the forgetting table with its continual-learning figures, and error counts.

The code lives in the package, minbert/prediction/leaderboard.py (metrics, scores, the leaderboard's CSVs) and
minbert/reports/tables.py (the forgetting table, its figures, error counts): the package uses them, and a course file
that the package imported while it imported the package would let the package's layers reach each other through it
(tests/test_module_boundaries.py). The names a reader of the course looks for here are these.
"""
from minbert.prediction.leaderboard import (DEFAULT_OUTPUTS, LEADERBOARD_COLUMNS, PredictionsFileError,
                                            check_predictions_file, kept_model_score, overall_of, overall_score,
                                            read_predictions, summarize_line, task_metrics, write_predictions)
from minbert.reports.tables import (BEFORE_TRAINING, HISTORY_METRICS, OPTIONAL_HISTORY_METRICS, TASK_SCORES,
                                    ForgettingMeasures, error_counts, forgetting_measures, forgetting_table_markdown,
                                    history_forgetting_measures, history_matrix)

__all__ = ["BEFORE_TRAINING", "DEFAULT_OUTPUTS", "HISTORY_METRICS", "LEADERBOARD_COLUMNS", "OPTIONAL_HISTORY_METRICS",
           "TASK_SCORES", "ForgettingMeasures", "PredictionsFileError", "check_predictions_file", "error_counts",
           "forgetting_measures", "forgetting_table_markdown", "history_forgetting_measures", "history_matrix",
           "kept_model_score", "overall_of", "overall_score", "read_predictions", "summarize_line", "task_metrics",
           "write_predictions"]
