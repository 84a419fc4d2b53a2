"""The zoo's models: torchvision networks and small Hugging Face configs, all with random weights (never a download).

``MODELS``: name -> ``Spec``. ``Spec.build(torch)`` returns ``(module, inputs)``: a module in eval mode on the CPU in
float32 whose ``forward`` takes the inputs positionally and returns one tensor (``FirstTensor`` adapts models that
take keyword arguments or return dicts / ModelOutputs), and a tuple of example inputs (float tensors become the
dtype under test, integer ones stay int64). Batch 2 everywhere; decoders run a full sequence with ``use_cache=False``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

BATCH = 2
SEQUENCE = 16
VOCABULARY = 1000


@dataclass(frozen=True)
class Spec:
    family: str  # "torchvision" or "transformers": the package it needs
    build: Callable  # build(torch) -> (module, inputs)
    quick: bool = False  # part of the --quick subset
    slow: bool = False  # among the slowest to export and plan: started first when models run in parallel


def _wrapped(torch, model, names: tuple[str, ...]):
    """``model`` called with keyword inputs ``names``, returning its first tensor."""

    class FirstTensor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            result = self.model(**dict(zip(names, inputs)))
            if isinstance(result, dict) or hasattr(result, "to_tuple"):  # torchvision's dicts, HF's ModelOutput
                result = next(iter(result.values()))
            elif isinstance(result, (tuple, list)):
                result = result[0]
            return result

    return FirstTensor().eval()


def random_weights_ready(torch, model, images) -> None:
    """Makes a torchvision ``model``'s random weights give a finite, non-zero output in 16 bits: parameters that
    start all zero (ViT's head: its output would be zero and compare nothing) get normal(0, 0.02) values, and the
    BatchNorm running statistics are measured on ``images`` (one forward with only the batch norms in train mode and
    a cumulative average): with the initial ones (mean 0, variance 1) a random-weight network's activations grow
    layer after layer and overflow float16, and PyTorch's own error then reads inf or 1. Leaves it in eval mode."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and not parameter.any():
                torch.nn.init.normal_(parameter, std=0.02)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
        norm.train()
    with torch.no_grad():
        model(images)
    model.eval()


def _torchvision(name: str, size: int = 224, **kwargs):
    def build(torch):
        import torchvision

        torch.manual_seed(0)
        owner = torchvision.models
        *packages, function = name.split(".")  # "segmentation.deeplabv3_mobilenet_v3_large"
        for package in packages:
            owner = getattr(owner, package)
        model = getattr(owner, function)(weights=None, **kwargs).eval()
        image = torch.randn(BATCH, 3, size, size)
        random_weights_ready(torch, model, torch.randn(BATCH, 3, size, size))
        return _wrapped(torch, model, ("x",)), (image,)

    return build


def _tokens(torch, with_mask: bool):
    """(input_ids, attention_mask): random ids; the second sequence padded over its last quarter."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCABULARY, (BATCH, SEQUENCE), generator=generator)
    if not with_mask:
        return (ids,)
    mask = torch.ones(BATCH, SEQUENCE, dtype=torch.int64)
    mask[1, SEQUENCE - SEQUENCE // 4:] = 0
    return ids, mask


def _transformers(config_name: str, model_name: str, config: dict, inputs: str, module: str | None = None):
    """A Hugging Face model from its config class with ``config`` (small sizes), random weights. ``inputs``:
    "ids" (input_ids), "ids+mask" (input_ids, attention_mask), "pixels" (pixel_values [2, 3, 32, 32]) or
    "features" (Whisper's input_features [2, 80, 2 * max_source_positions]). Decoders' configs say use_cache=False."""

    def build(torch):
        import importlib

        import transformers

        torch.manual_seed(0)
        config_object = getattr(transformers, config_name)(**config)
        owner = importlib.import_module(module) if module else transformers
        model = getattr(owner, model_name)(config_object).eval()  # the library's default attention (SDPA)
        if inputs == "ids":
            return _wrapped(torch, model, ("input_ids",)), _tokens(torch, False)
        if inputs == "ids+mask":
            return _wrapped(torch, model, ("input_ids", "attention_mask")), _tokens(torch, True)
        if inputs == "pixels":
            size = config["image_size"]
            return _wrapped(torch, model, ("pixel_values",)), (torch.randn(BATCH, 3, size, size),)
        frames = 2 * config["max_source_positions"]
        return _wrapped(torch, model, ("input_features",)), (torch.randn(BATCH, config["num_mel_bins"], frames),)

    return build


_TEXT = dict(vocab_size=VOCABULARY, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=256, max_position_embeddings=64)
_DECODER = dict(vocab_size=VOCABULARY, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
_VISION = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=32,
               patch_size=8)

MODELS: dict[str, Spec] = {
    "resnet18": Spec("torchvision", _torchvision("resnet18"), quick=True),
    "resnet50": Spec("torchvision", _torchvision("resnet50")),
    "resnext50_32x4d": Spec("torchvision", _torchvision("resnext50_32x4d")),
    "wide_resnet50_2": Spec("torchvision", _torchvision("wide_resnet50_2")),
    "mobilenet_v2": Spec("torchvision", _torchvision("mobilenet_v2")),
    "mobilenet_v3_large": Spec("torchvision", _torchvision("mobilenet_v3_large"), quick=True),
    "efficientnet_b0": Spec("torchvision", _torchvision("efficientnet_b0")),
    "efficientnet_v2_s": Spec("torchvision", _torchvision("efficientnet_v2_s"), slow=True),
    "densenet121": Spec("torchvision", _torchvision("densenet121"), slow=True),
    "googlenet": Spec("torchvision", _torchvision("googlenet", aux_logits=False, init_weights=True)),
    "inception_v3": Spec("torchvision", _torchvision("inception_v3", size=299, aux_logits=False, init_weights=True),
                         slow=True),
    "convnext_tiny": Spec("torchvision", _torchvision("convnext_tiny"), quick=True),
    "vit_b_16": Spec("torchvision", _torchvision("vit_b_16"), slow=True),
    "vgg11_bn": Spec("torchvision", _torchvision("vgg11_bn")),
    "shufflenet_v2_x1_0": Spec("torchvision", _torchvision("shufflenet_v2_x1_0")),
    "deeplabv3_mobilenet_v3_large": Spec("torchvision", _torchvision("segmentation.deeplabv3_mobilenet_v3_large",
                                                                     size=128, weights_backbone=None), slow=True),
    "bert": Spec("transformers", _transformers("BertConfig", "BertModel", _TEXT, "ids+mask"), quick=True),
    "roberta": Spec("transformers", _transformers("RobertaConfig", "RobertaModel", dict(_TEXT, pad_token_id=1,
                                                                                        max_position_embeddings=66),
                                                  "ids+mask")),
    "gpt2": Spec("transformers", _transformers("GPT2Config", "GPT2LMHeadModel",
                                               dict(vocab_size=VOCABULARY, n_embd=128, n_layer=2, n_head=4,
                                                    n_positions=64, use_cache=False), "ids"), quick=True),
    "llama": Spec("transformers", _transformers("LlamaConfig", "LlamaForCausalLM", _DECODER, "ids"), quick=True,
                  slow=True),
    "mistral": Spec("transformers", _transformers("MistralConfig", "MistralForCausalLM", _DECODER, "ids"),
                    slow=True),
    "vit": Spec("transformers", _transformers("ViTConfig", "ViTModel", _VISION, "pixels")),
    "clip_vision": Spec("transformers", _transformers("CLIPVisionConfig", "CLIPVisionModel", _VISION, "pixels")),
    "t5_encoder": Spec("transformers", _transformers("T5Config", "T5EncoderModel",
                                                     dict(vocab_size=VOCABULARY, d_model=128, d_kv=32, d_ff=256,
                                                          num_layers=2, num_heads=4), "ids+mask")),
    "whisper_encoder": Spec("transformers", _transformers(
        "WhisperConfig", "WhisperEncoder", dict(d_model=128, encoder_layers=2, encoder_attention_heads=4,
                                                encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=32),
        "features", module="transformers.models.whisper.modeling_whisper")),
}
