"""The data layer: the tasks' files batched (batches.py), NLI pairs for SimCSE, and the scores files runs save for
ensembles and distillation."""
