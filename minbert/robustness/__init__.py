"""The robustness suite (scripts/robustness.py, docs/robustness_suite.md): a run's model scored on perturbed dev sets
and under attack, with the clean score beside each and the drop's bootstrap interval.

    text_noise.py        seeded character and word noise at a rate
    neighbours.py        the nearest whole words in the model's input-embedding space
    perturbed_sets.py    the noisy dev sets on disk in the course's format, with their manifest, made once and reused
    embedding_attack.py  projected gradient ascent on the gold loss in an eps-ball around the input embeddings (SMART's
                         threat model), over a sweep of eps
    greedy_attack.py     greedy word substitution with a query budget
    report.py            the table: clean, perturbed, drop [95% interval]
    ensemble_predictor.py  what the suite scores: one run's model, or several runs' ensemble (their mean)
    suite.py             the families, registered (FAMILIES), on one model or an ensemble
"""
