"""A model zoo from Hugging Face transformers (installed from PyPI into the
test environment; small random-init configs, nothing downloaded) for the
transparency tests of tests/python/test_model_zoo.py and the benchmarks.

Each `ZooCase` builds a model (dropout off, so eager and modelpar compute
the same function), a batch on a seed, the loss computed inside the model
(`step`: for 1F1B, the loss is compiled in) and the prediction with the
loss outside (`predict` + `loss`: GPipe's split mode).

| name | architecture | what it exercises |
|---|---|---|
| `llama` | decoder-only LM | rotary embeddings, grouped-query attention, RMSNorm, SwiGLU |
| `qwen2` | decoder-only LM | rotary, GQA, biased q/k/v projections |
| `mistral` | decoder-only LM | rotary, GQA, sliding-window attention mask |
| `gpt2` | decoder-only LM | learned positions, Conv1D projections, tied embeddings |
| `bert` | encoder | token types, absolute positions, pooler, classification head |
| `t5` | encoder-decoder | relative position buckets, shifted decoder inputs, cross attention |
| `vit` | vision transformer | patch embedding (conv), CLS token, position embeddings |
| `resnet` | CNN | convolutions, batch norm (running statistics), pooling |
| `mixtral` | mixture-of-experts LM | top-2 routing, rows sorted by expert, expert counts (histc) as a grouped matmul's row groups |
| `bart` | encoder-decoder | learned positions, shifted decoder inputs, cross attention, tied embeddings |
| `convnext` | CNN | depthwise 7x7 convolutions, channels-last LayerNorm, layer scale |
| `swin` | vision transformer | shifted windows (roll, window partition), relative position bias, patch merging |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tolerances import Reordered

VOCAB, SEQ, CLASSES = 64, 16, 5


@dataclass
class ZooCase:
    """A transformers model, a batch, and its loss both ways."""
    make_model: Callable[[], nn.Module]
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (seed, batch) -> (x, y)
    #: the model's output -> the prediction (logits)
    predict: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    #: (prediction, target) -> loss
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    #: fp32 reduction-order tolerance (tests/python/tolerances.py): longest sum, depth
    tol: Reordered
    batch_size: int = 4

    def step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss, computed inside the compiled function."""
        return self.loss(self.predict(model, x), y)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=_gen(seed))
    return ids, torch.roll(ids, -1, dims=1)


def _token_classes(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    return torch.randint(0, VOCAB, (n, SEQ), generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _images(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return make().train()
    return build


def _decoder(config_cls: str, model_cls: str, **extra) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers
        cfg = getattr(transformers, config_cls)(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
            attention_dropout=0.0, **extra)
        cfg._attn_implementation = "sdpa"
        return getattr(transformers, model_cls)(cfg)
    return _seeded(make)


def _gpt2() -> nn.Module:
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=32, n_layer=2,
                                  n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert() -> nn.Module:
    import transformers
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=2 * SEQ, num_labels=CLASSES,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(cfg)


def _t5() -> nn.Module:
    import transformers
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=0,
                                pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _vit() -> nn.Module:
    import transformers
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 num_labels=CLASSES, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    return transformers.ViTForImageClassification(cfg)


def _resnet() -> nn.Module:
    import transformers
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                    depths=[1, 1], layer_type="basic", num_labels=CLASSES)
    return transformers.ResNetForImageClassification(cfg)


def _bart() -> nn.Module:
    import transformers
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=64, decoder_ffn_dim=64,
                                  max_position_embeddings=2 * SEQ, dropout=0.0,
                                  attention_dropout=0.0, activation_dropout=0.0)
    return transformers.BartForConditionalGeneration(cfg)


def _convnext() -> nn.Module:
    import transformers
    cfg = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1],
                                      num_stages=2, image_size=16, patch_size=2,
                                      drop_path_rate=0.0, num_labels=CLASSES)
    return transformers.ConvNextForImageClassification(cfg)


def _swin() -> nn.Module:
    import transformers
    cfg = transformers.SwinConfig(image_size=16, patch_size=2, num_channels=3, embed_dim=16,
                                  depths=[1, 1], num_heads=[2, 2], window_size=4,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  drop_path_rate=0.0, num_labels=CLASSES)
    return transformers.SwinForImageClassification(cfg)


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).logits


def _t5_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # The decoder reads the target shifted right (teacher forcing); here the
    # target is the input rolled by one, so the decoder input is a function of x.
    # (BART's decoder is fed the same way.)
    return model(input_ids=x, decoder_input_ids=torch.roll(x, 1, dims=1)).logits


ZOO: dict[str, ZooCase] = {
    # hidden 32, MLP 64, vocab 64, batch x positions 4 x 16 = 64; 2 layers of ~8 reductions
    "llama": ZooCase(_decoder("LlamaConfig", "LlamaForCausalLM"), _tokens, _logits, _lm_loss,
                     Reordered(64, depth=40)),
    "qwen2": ZooCase(_decoder("Qwen2Config", "Qwen2ForCausalLM"), _tokens, _logits, _lm_loss,
                     Reordered(64, depth=40)),
    "mistral": ZooCase(_decoder("MistralConfig", "MistralForCausalLM", sliding_window=8),
                       _tokens, _logits, _lm_loss, Reordered(64, depth=40)),
    "gpt2": ZooCase(_seeded(_gpt2), _tokens, _logits, _lm_loss, Reordered(128, depth=40)),
    "bert": ZooCase(_seeded(_bert), _token_classes, _logits, F.cross_entropy,
                    Reordered(64, depth=40)),
    # encoder and decoder of 2 layers each, cross attention
    "t5": ZooCase(_seeded(_t5), _tokens, _t5_logits, _lm_loss, Reordered(64, depth=60)),
    # 16 patches x batch 4 = 64 positions, patch conv sums 3 x 4 x 4 = 48
    "vit": ZooCase(_seeded(_vit), _images, _logits, F.cross_entropy, Reordered(64, depth=40)),
    # batch norm over 4 x 8 x 8 positions = 256 after the stem; 5 convolutions deep
    "resnet": ZooCase(_seeded(_resnet), _images, _logits, F.cross_entropy,
                      Reordered(1024, depth=14)),
    # 4 experts, 2 per token: each token's rows go through 2 of them
    "mixtral": ZooCase(_decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
                                num_experts_per_tok=2),
                       _tokens, _logits, _lm_loss, Reordered(64, depth=40)),
    "bart": ZooCase(_seeded(_bart), _tokens, _t5_logits, _lm_loss, Reordered(64, depth=60)),
    # LayerNorm over 8-16 channels, 7x7 depthwise sums of 49 terms, 64 positions x batch 4
    "convnext": ZooCase(_seeded(_convnext), _images, _logits, F.cross_entropy,
                        Reordered(256, depth=20)),
    # windows of 4 x 4 = 16 positions; 64 patches x batch 4 before merging
    "swin": ZooCase(_seeded(_swin), _images, _logits, F.cross_entropy, Reordered(256, depth=40)),
}


def checkpointed(model: nn.Module) -> None:
    """The model's own activation checkpointing (non-reentrant), as training
    scripts turn it on."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # transformers logs (a graph break) that the cache is off under
    # checkpointing unless it is off already
    model.config.use_cache = False


def dropping(p: float):
    """A model preparation: its own checkpointing, every dropout at p."""
    def prepare(model: nn.Module) -> None:
        checkpointed(model)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
    return prepare



# The attention projections LoRA adapts in each architecture (peft's usual
# target_modules for it).
LORA_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"],
    "mixtral": ["q_proj", "v_proj"], "gpt2": ["c_attn"], "bert": ["query", "value"],
    "vit": ["query", "value"], "t5": ["q", "v"], "bart": ["q_proj", "v_proj"],
}


def lora_adapters(name: str) -> Callable[[nn.Module], None]:
    """A model preparation: fine-tuning with LoRA adapters (peft, rank 4) on
    the attention projections, every other parameter frozen (requires_grad
    False, as peft's get_peft_model leaves them). The adapters' B matrices
    start at small random values instead of peft's zeros, so that every
    gradient of the first step is nonzero."""
    def prepare(model: nn.Module) -> None:
        from peft import LoraConfig, inject_adapter_in_model
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                           target_modules=LORA_TARGETS[name]), model)
        g = _gen(1)
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
            if "lora_B" in n:
                with torch.no_grad():
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return prepare


def frozen_first_half(model: nn.Module) -> None:
    """A model preparation: the first half of the parameters (embeddings and
    the early layers) frozen, as fine-tuning the top of a network does."""
    params = list(model.parameters())
    for p in params[:len(params) // 2]:
        p.requires_grad_(False)
