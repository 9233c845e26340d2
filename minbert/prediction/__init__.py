"""Prediction: a model's predictions and scores on a split, its evaluation on dev, and ensembles of runs."""
