"""A run's figures: forgetting matrix, training curves, error-analysis plots, t-SNE of sentence embeddings; and the
tables behind them (the forgetting table and its continual-learning figures, error counts)."""
