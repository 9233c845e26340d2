"""CFIMDB: the sentiment (0 negative, 1 positive) of a whole movie review, the second task of the handout's part 1
(classifier.py); the multitask model does not train it."""
from minbert.tasks.classification import SentenceClassification

TASK = SentenceClassification(name="cfimdb", order=3, part1=True, title="CFIMDB", file_prefix="ids-cfimdb",
                              flag_prefix="cfimdb", label_column="sentiment", leaderboard_column="Predicted_Sentiment",
                              num_classes=2, head_name="cfimdb_head",
                              label_names=("negative", "positive"))
