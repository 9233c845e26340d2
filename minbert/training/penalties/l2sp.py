"""L2-SP (continual.L2SP) as the run's penalty: --l2sp_weight alpha towards the weights BERT's checkpoint gave,
taken from the model as the run builds it (before a resume loads the run's own)."""
import math

from minbert.training.continual import DEFENCES_TITLE, L2SP
from minbert.training.objective import PenaltyFlag, PenaltyKind


def check(settings) -> None:
    if not (math.isfinite(settings.l2sp_weight) and settings.l2sp_weight >= 0):
        raise ValueError(f"--l2sp_weight must be a finite number >= 0, got {settings.l2sp_weight}")
    if not settings.l2sp_weight:
        return
    if settings.schedule != "sequential":
        raise ValueError("--l2sp_weight regularises the sequential schedule's stages; use --schedule sequential")
    if settings.option != "finetune":
        raise ValueError("--l2sp_weight holds the pretrained weights, which --option pretrain freezes; use --option "
                         "finetune")


def build(settings, model):
    if not settings.l2sp_weight:
        return None
    # BERT's own weights, all from the checkpoint; adapters start from no pretrained value.
    pretrained = [name for name, p in model.named_parameters()
                  if p.requires_grad and name.startswith("bert.") and ".adapters." not in name]
    return L2SP(model, settings.l2sp_weight, pretrained)


PENALTY = PenaltyKind(
    name="l2sp", title=DEFENCES_TITLE, build=build, check=check, on=lambda settings: settings.l2sp_weight > 0,
    flags={"l2sp_weight": PenaltyFlag(0.0, "alpha of L2-SP (Li et al. 2018): alpha/2 sum (theta - "
                                           "theta_pretrained)^2 over the trainable weights that came from "
                                           "--pretrained")})
