"""Prediction: a model's predictions and scores on a split, its evaluation on dev, the leaderboard's scores and CSVs,
and ensembles of runs."""
