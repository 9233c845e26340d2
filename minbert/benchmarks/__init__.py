"""The benchmark harness behind scripts/benchmark.py, the package's top layer (it builds runs as the run layer does):
every figure a ratio or a number measured in one run.

    settings.py        what a run asks for (BenchmarkSettings) and the setup each result records
    command_line.py    the script's flags, checked in one line each before anything loads
    models.py          the models and batches timed: minBERT for --config, transformers' peer, a MultitaskBERT step
    timing.py          alternating timed sides, the training step's update, model FLOPs utilisation
    training_steps.py  train-step comparisons: encoder, precision, smart, adapters, checkpointing
    memory.py          live tensor bytes of a step, the peak a step adds, the memory table
    throughput.py      pipeline, data_parallel, ensemble, predict, padding
    recipe_trainer.py  the Trainer that the recipes' training command line builds
    host_syncs.py      every operator and host sync a computation dispatches, by the project line that asked
    step_audit.py      step_audit: the host syncs, operators and graph breaks of one training step
    qqp_epoch.py       qqp_epoch: a QQP SMART epoch from timed real steps
    qa_peer.py         qa_peer: the SQuAD 2.0 peer run on transformers, its own command line

transformers, a test and benchmark dependency only, is imported inside the functions that time against it.
"""
