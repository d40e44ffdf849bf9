"""Model references build real models offline and produce trainable batches."""
import torch

from amp_bench.measure.models import build_workload, forward
from amp_bench.suite.model_refs import short_name


def train_once(workload, batch_size=2):
    inputs, target = workload.make_batch(batch_size, torch.device("cpu"))
    loss = workload.loss_fn(forward(workload.model, inputs), target)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    return inputs


def test_torchvision_model_with_channels_last():
    workload = build_workload({"ref": "torchvision/resnet18", "num_classes": 10}, image_size=32, seq_len=None,
                              channels_last=True)
    inputs = train_once(workload)
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    assert workload.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_torchvision_model_with_aux_outputs():
    workload = build_workload({"ref": "torchvision/googlenet", "num_classes": 10}, image_size=64, seq_len=None,
                              channels_last=False)
    train_once(workload)


def test_transformers_models_from_config_record_attention():
    bert = build_workload({"ref": "transformers/bert", "config": {"num_hidden_layers": 1, "hidden_size": 32,
                                                                  "num_attention_heads": 2, "intermediate_size": 64},
                           "attn_implementation": "eager"}, image_size=None, seq_len=16, channels_last=False)
    inputs = train_once(bert)
    assert inputs["input_ids"].shape == (2, 16)
    assert bert.details == {"attn_implementation": "eager", "task": "masked-lm", "vocab_size": 30522}
    gpt2 = build_workload({"ref": "transformers/gpt2", "task": "sequence-classification",
                           "config": {"n_layer": 1, "n_embd": 32, "n_head": 2}}, image_size=None, seq_len=8,
                          channels_last=False)
    train_once(gpt2)
    assert gpt2.details == {"attn_implementation": "sdpa", "task": "sequence-classification", "vocab_size": 50257}


def test_python_model(tmp_path):
    from conftest import FIXTURES
    workload = build_workload({"ref": "python:toy_models:mlp", "options": {"hidden": 8}}, image_size=None,
                              seq_len=None, channels_last=False, search_dirs=(str(FIXTURES),))
    train_once(workload)
    assert workload.model[0].out_features == 8
    assert short_name("python:toy_models:mlp") == "mlp" and short_name("torchvision/resnet50") == "resnet50"


def test_a_padded_vocabulary_widens_the_embedding_and_lm_head_but_not_the_tokens_drawn():
    """pad_vocab_to_multiple_of (an advice item `run --try` applies): GPT-2's 1001 -> 1024, as nanoGPT's
    50257 -> 50304; the batch still draws from the first 1001 tokens, so no target is a padding row."""
    from amp_bench.measure.models import build_workload
    spec = {"ref": "transformers/gpt2", "config": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 1001,
                                                  "n_positions": 16}, "pad_vocab_to_multiple_of": 64}
    padded = build_workload(spec, image_size=None, seq_len=16, channels_last=False)
    assert padded.model.lm_head.out_features == 1024 and padded.details["vocab_size"] == 1024
    inputs, _ = padded.make_batch(64, "cpu")
    assert int(inputs["input_ids"].max()) < 1001
    plain = build_workload({**spec, "pad_vocab_to_multiple_of": None}, image_size=None, seq_len=16, channels_last=False)
    assert plain.model.lm_head.out_features == 1001
