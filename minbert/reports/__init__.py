"""A run's figures: forgetting matrix, training curves, error-analysis plots, t-SNE of sentence embeddings."""
