"""The CUDA path (marker `gpu`; skipped without CUDA): bf16 and fp16 against float32 for BERT, SMART, SimCSE and
LoRA, the attention kernel SDPA actually runs, fp16 resume with its gradient scaler, and the memory of the
batch-32 x 128 SMART step of bert-base. scripts/gpu_check.sh runs these with the rest of the GPU checks.

Tolerances, relative to the float32 result on the same weights and batch: bf16 (8-bit mantissa) 5e-2,
fp16 (11-bit) 1e-2 on hidden states and losses; gradients point the same way (cosine >= 0.99).
"""
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import pair_batch, sentence_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_batch(batch: dict) -> dict:
    from minbert.runtime import to_device
    return to_device(batch, torch.device("cuda"))


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def gradient_cosine(model_a, model_b) -> float:
    a = torch.cat([p.grad.flatten() for p in model_a.parameters() if p.grad is not None])
    b = torch.cat([p.grad.flatten() for p in model_b.parameters() if p.grad is not None])
    return F.cosine_similarity(a.float(), b.float(), dim=0).item()


def minilm_multitask(**options):
    from bert import BertModel
    from minbert.model.multitask_bert import MultitaskBERT
    torch.manual_seed(0)
    model = MultitaskBERT(BertModel.from_pretrained("minilm-l6"), **options)
    return model.cuda().eval()  # dropout off: the precisions see the same network


def loss_and_grads(model, task: str, batch: dict, precision: str, regularizer=None):
    from minbert.runtime import autocast
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with autocast(torch.device("cuda"), precision):
        loss, _ = compute_task_loss(model, task, batch, [SmartPenalty({task: regularizer})] if regularizer else [])
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_bert_forward_and_backward_stay_near_float32(precision, tokenizer):
    import copy
    reference = minilm_multitask()
    model = copy.deepcopy(reference)
    batch = cuda_batch(pair_batch(tokenizer, "sts", 16))
    expected = loss_and_grads(reference, "sts", batch, "fp32")
    got = loss_and_grads(model, "sts", batch, precision)
    assert relative_error(got, expected) < TOLERANCE[precision]
    assert gradient_cosine(model, reference) > 0.99
    with torch.no_grad(), torch.autocast("cuda", dtype=DTYPES[precision]):
        hidden = model.bert(batch["input_ids_1"], batch["attention_mask_1"])["last_hidden_state"]
    with torch.no_grad():
        float32 = reference.bert(batch["input_ids_1"], batch["attention_mask_1"])["last_hidden_state"]
    assert relative_error(hidden, float32) < TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_smart_step_equals_float32_under_autocast(precision, tokenizer):
    """With --smart_precision exact, SMART's passes run in exact float32 (no autocast, no TF32) whatever the run's
    precision (by default they run at the run's: tests/test_smart.py)."""
    from minbert.runtime import use_tf32
    from smart import SmartConfig, SmartRegularizer
    use_tf32(torch.device("cuda"))  # as a training run sets it
    model = minilm_multitask()
    regularizer = SmartRegularizer(model, SmartConfig(bregman_weight=0.0, precision="exact"))
    batch = cuda_batch(sentence_batch(tokenizer, 16))
    expected = loss_and_grads(model, "sst", batch, "fp32", regularizer)
    got = loss_and_grads(model, "sst", batch, precision, regularizer)
    assert got.dtype == torch.float32 and relative_error(got, expected) < 1e-6


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_simcse_losses_are_float32_under_autocast(precision):
    from simcse import supervised_simcse_loss
    generator = torch.Generator(device="cuda").manual_seed(0)
    a, p, n = (torch.randn(32, 768, device="cuda", generator=generator) for _ in range(3))
    expected = supervised_simcse_loss(a, p, n)
    with torch.autocast("cuda", dtype=DTYPES[precision]):
        got = supervised_simcse_loss(a, p, n)
    assert got.dtype == torch.float32 and relative_error(got, expected) < 1e-6


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lora_forward_and_backward_stay_near_float32(precision, tokenizer):
    import copy

    from minbert.model.adapters import AdapterConfig
    from minbert.model.multitask_bert import freeze_encoder
    reference = minilm_multitask(adapter=AdapterConfig("lora"))
    freeze_encoder(reference)
    for name, parameter in reference.named_parameters():  # B starts at zero: move it so A gets a gradient too
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    model = copy.deepcopy(reference)
    batch = cuda_batch(sentence_batch(tokenizer, 16))
    expected = loss_and_grads(reference, "sst", batch, "fp32")
    got = loss_and_grads(model, "sst", batch, precision)
    assert relative_error(got, expected) < TOLERANCE[precision]
    assert gradient_cosine(model, reference) > 0.99


def test_sdpa_runs_flash_attention_on_unpadded_batches():
    """Flash attention takes no mask: minBERT passes none when the batch has no padding, so the flash kernel
    alone (the only one allowed here) runs forward and backward; a padded batch needs a masked kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from base_bert import BertConfig
    from bert import BertModel
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().train()
    ids = torch.randint(1000, 30000, (8, 128), device="cuda")
    full = torch.ones_like(ids)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids, full)["last_hidden_state"].float().pow(2).mean().backward()
    padded = full.clone()
    padded[1:, 100:] = 0
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids, padded)["last_hidden_state"].float().pow(2).mean().backward()


def test_fp16_resume_equals_an_uninterrupted_run(tiny_checkpoint, tmp_path):
    """--precision fp16 on CUDA: the gradient scaler's state is saved, restored, and the resumed run ends where
    the uninterrupted one does (to the float tolerance of CUDA's non-deterministic kernels)."""
    from test_multitask_classifier import run_flags

    import multitask_classifier as mc

    def flags(out, *extra):
        return [f for f in run_flags(tiny_checkpoint, out, "--use_gpu", "--precision", "fp16", *extra) if f != "--smart"]
    assert mc.main(flags(tmp_path / "straight")) == 0
    assert mc.main(flags(tmp_path / "cut", "--stop_after_stages", "2")) == 0
    assert mc.main(flags(tmp_path / "cut", "--resume")) == 0
    straight, cut = (json.loads((tmp_path / name / "run" / "last.json").read_text()) for name in ("straight", "cut"))
    assert straight["grad_scaler"] == cut["grad_scaler"] and straight["grad_scaler"]["scale"] > 0
    expected, got = (load_file(tmp_path / name / "run" / "last.safetensors") for name in ("straight", "cut"))
    for key in expected:
        if key.startswith("model."):
            torch.testing.assert_close(got[key], expected[key], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_batch_32x128_smart_step_of_bert_base_fits_in_12_gib(checkpointing):
    """The memory goal on the GPU itself: SMART's step in float32, every sequence full. BENCHMARKS' CPU count
    puts it at about 12.1 GiB of tensors without gradient checkpointing (the goal is then missed, reported as an
    expected failure with the figure, which belongs in BENCHMARKS) and 3.3 GiB with it."""
    from base_bert import BertConfig
    from bert import BertModel
    from minbert.model.multitask_bert import MultitaskBERT
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    from optimizer import AdamW
    from smart import SmartConfig, SmartRegularizer
    torch.manual_seed(0)
    model = MultitaskBERT(BertModel(BertConfig())).cuda().train()
    model.bert.encoder.gradient_checkpointing = checkpointing
    optimizer = AdamW(model.parameters(), lr=1e-5)
    regularizer = SmartRegularizer(model, SmartConfig())
    ids = torch.randint(1000, 30000, (2, 32, 128), device="cuda")
    full = torch.ones(32, 128, dtype=torch.long, device="cuda")
    batch = {"input_ids_1": ids[0], "attention_mask_1": full, "input_ids_2": ids[1], "attention_mask_2": full,
             "labels": torch.randint(0, 2, (32,), device="cuda").float()}
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):  # the second step holds AdamW's moments too
        optimizer.zero_grad(set_to_none=True)
        compute_task_loss(model, "qqp", batch, [SmartPenalty({"qqp": regularizer})])[0].backward()
        optimizer.step()
        regularizer.anchor.update(model)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"peak memory of a batch-32 x 128 SMART step of bert-base (checkpointing {checkpointing}): {peak:.2f} GiB")
    if not checkpointing and peak >= 12:
        pytest.xfail(f"{peak:.2f} GiB without gradient checkpointing, as BENCHMARKS' CPU count predicts")
    assert peak < 12
