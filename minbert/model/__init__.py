"""The model: MultitaskBERT over minBERT (the heads are the tasks'), adapters, checkpoints."""
