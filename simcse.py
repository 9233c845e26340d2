"""The course's simcse.py: contrastive sentence-embedding losses (SimCSE, Gao et al. 2021) and the batches of NLI
triplets they train on.

The code lives in minbert/training/simcse.py: the package trains with it, and a course file that the package imported
while it imported the package would let the package's layers reach each other through it
(tests/test_module_boundaries.py). The names a reader of the course looks for here are these.
"""
from minbert.training.simcse import (SIMCSE_OBJECTIVES, pairwise_contrastive_loss, supervised_simcse_loss,
                                     triplet_batches)

__all__ = ["SIMCSE_OBJECTIVES", "pairwise_contrastive_loss", "supervised_simcse_loss", "triplet_batches"]
