"""EWC (continual.ElasticWeightConsolidation) as the run's penalty: --ewc_weight lambda on the encoder's trainable
parameters that the tasks share (with adapters shared by the tasks, those), the Fisher consolidated on the first
--ewc_fisher_batches batches whenever a block of stages of one task gives way to the next."""
import math

from minbert.training.continual import DEFENCES_TITLE, ElasticWeightConsolidation
from minbert.training.objective import PenaltyFlag, PenaltyKind


def check(settings) -> None:
    if not (math.isfinite(settings.ewc_weight) and settings.ewc_weight >= 0):
        raise ValueError(f"--ewc_weight must be a finite number >= 0, got {settings.ewc_weight}")
    if settings.ewc_fisher_batches < 1:
        raise ValueError(f"--ewc_fisher_batches must be >= 1, got {settings.ewc_fisher_batches}")
    if not settings.ewc_weight:
        return
    if settings.schedule != "sequential":
        raise ValueError("--ewc_weight regularises the sequential schedule's stages; use --schedule sequential")
    if settings.option != "finetune" and not (settings.adapter != "none" and settings.adapter_sharing == "shared"):
        raise ValueError("--ewc_weight holds the trainable encoder parameters shared by the tasks: with --option "
                         "pretrain that needs --adapter ... --adapter_sharing shared")


def build(settings, model):
    if not settings.ewc_weight:
        return None
    # A task's own head or adapters, which no other task trains, cannot be forgotten by another task's stage.
    shared = [name for name, p in model.named_parameters() if p.requires_grad and model.is_shared(name)]
    return ElasticWeightConsolidation(model, settings.ewc_weight, shared, settings.ewc_fisher_batches)


PENALTY = PenaltyKind(
    name="ewc", title=DEFENCES_TITLE, build=build, check=check, on=lambda settings: settings.ewc_weight > 0,
    flags={"ewc_weight": PenaltyFlag(0.0, "lambda of EWC (Kirkpatrick et al. 2017) on the trainable encoder "
                                          "parameters: lambda/2 sum F (theta - theta*)^2, the diagonal Fisher F "
                                          "consolidated, at the weights theta* the next stage starts from, whenever "
                                          "a block of stages of one task gives way to the next"),
           "ewc_fisher_batches": PenaltyFlag(100, "the Fisher's batches: the first of the finished block's last "
                                                  "stage, by its task's loss alone (no SMART, LNSR or distillation)",
                                             type=int, tunes=True)})
