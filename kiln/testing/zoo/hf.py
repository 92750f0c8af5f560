"""Architectures of the ``transformers`` package, built from their configuration classes.

Every model is made offline (``HF_HUB_OFFLINE=1``; no ``from_pretrained``): a configuration
with small sizes (hidden width 64, 2 layers, 4 heads, short sequences, small images) and random
weights. The torch module wrapped around it takes the inputs positionally, in the order of the
entry's :class:`~kiln.testing.zoo.catalogue.InputSpec` list, and returns the model output's
first tensor (the last hidden state of a base model, the logits of a head). ``use_cache=False``
keeps past key/value caches out of the exported graph.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .catalogue import OPSET, InputSpec, ZooModel, register

VOCAB = 512
SEQ = 16
BATCH = 2

#: BERT-style names of the sizes, which most configurations accept.
BERTLIKE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": VOCAB, "max_position_embeddings": 64,
            "pad_token_id": 0}
#: Decoder-only language models of the Llama line (grouped-query attention, rotary positions).
LLAMALIKE = {**BERTLIKE, "num_key_value_heads": 2, "head_dim": 16, "use_cache": False}
#: BART-style encoder-decoder sizes.
BARTLIKE = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128, "vocab_size": VOCAB, "max_position_embeddings": 64,
            "use_cache": False}
T5LIKE = {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2,
          "num_heads": 4, "vocab_size": VOCAB, "use_cache": False}
#: wav2vec 2.0-style speech encoders: a 2-layer conv feature extractor (stride 10) over
#: raw audio, then the transformer.
WAV2VEC = {**BERTLIKE, "conv_dim": (32, 32), "conv_stride": (5, 2), "conv_kernel": (10, 3),
           "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4,
           "num_feat_extract_layers": 2, "mask_time_prob": 0.0}
VIT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "intermediate_size": 128, "image_size": 32, "patch_size": 8, "num_channels": 3}
#: Hierarchical vision backbones (Swin, ConvNeXt, ...): 2 stages.
STAGES = {"image_size": 32, "num_channels": 3}


def text(vocab: int = VOCAB, mask: bool = True, seq: int = SEQ) -> tuple[InputSpec, ...]:
    """Token ids (and an attention mask with a padded tail) of ``BATCH`` rows."""
    ids = InputSpec("input_ids", (BATCH, seq), "ids", vocab)
    return (ids, InputSpec("attention_mask", (BATCH, seq), "mask")) if mask else (ids,)


def seq2seq(vocab: int = VOCAB) -> tuple[InputSpec, ...]:
    """Encoder ids and mask, and decoder ids (half the length)."""
    return text(vocab) + (InputSpec("decoder_input_ids", (BATCH, SEQ // 2), "ids", vocab),)


def image(size: int = 32) -> tuple[InputSpec, ...]:
    return (InputSpec("pixel_values", (1, 3, size, size)),)


def audio(samples: int = 1600) -> tuple[InputSpec, ...]:
    """Raw audio: 0.1 s at 16 kHz."""
    return (InputSpec("input_values", (1, samples)),)


def build(config: Mapping[str, Any]) -> Any:
    """The wrapped transformers model of ``config`` (see the module docstring)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    conf = getattr(transformers, config["config"])(**config["kwargs"])
    if config.get("attn"):
        conf._attn_implementation = config["attn"]
    model = getattr(transformers, config["model"])(conf).eval()
    names = tuple(config["inputs"])

    class FirstOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            out = self.model(**dict(zip(names, args)), return_dict=True)
            return out.to_tuple()[0]

    return FirstOutput().eval()


def hf(name: str, family: str, model: str, kwargs: Mapping[str, Any],
       inputs: tuple[InputSpec, ...], config: str | None = None, ci: bool = False,
       attn: str | None = None, opset: int = OPSET) -> ZooModel:
    """Register ``transformers.<model>`` built from ``transformers.<config>(**kwargs)``
    (``config`` defaults to the model's name with ``Model``/``ForCausalLM`` replaced by
    ``Config``)."""
    if config is None:
        stem = model
        for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model"):
            if stem.endswith(suffix):
                stem = stem[:-len(suffix)]
                break
        config = stem + "Config"
    cfg = {"model": model, "config": config, "kwargs": dict(kwargs),
           "inputs": [s.name for s in inputs], "attn": attn}
    return register(ZooModel(name, family, "transformers", build, cfg, inputs, ci=ci,
                             opset=opset))


# --- text encoders --------------------------------------------------------------------------
hf("bert", "encoder", "BertModel", BERTLIKE, text(), ci=True)
hf("roberta", "encoder", "RobertaModel", BERTLIKE, text())
hf("xlm-roberta", "encoder", "XLMRobertaModel", BERTLIKE, text())
hf("camembert", "encoder", "CamembertModel", BERTLIKE, text())
hf("electra", "encoder", "ElectraModel", {**BERTLIKE, "embedding_size": 32}, text())
hf("deberta", "encoder", "DebertaModel", BERTLIKE, text())
hf("deberta-v2", "encoder", "DebertaV2Model", BERTLIKE, text())
hf("distilbert", "encoder", "DistilBertModel",
   {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128, "vocab_size": VOCAB},
   text(), ci=True)
hf("albert", "encoder", "AlbertModel", {**BERTLIKE, "embedding_size": 32}, text(), ci=True)
hf("mpnet", "encoder", "MPNetModel", BERTLIKE, text())
hf("convbert", "encoder", "ConvBertModel", {**BERTLIKE, "embedding_size": 64}, text())
hf("squeezebert", "encoder", "SqueezeBertModel", {**BERTLIKE, "embedding_size": 64}, text())
hf("mobilebert", "encoder", "MobileBertModel",
   {**BERTLIKE, "embedding_size": 32, "intra_bottleneck_size": 32, "true_hidden_size": 32,
    "num_feedforward_networks": 2}, text())
hf("funnel", "encoder", "FunnelModel",
   {"d_model": 64, "n_head": 4, "d_head": 16, "d_inner": 128, "block_sizes": [1, 1],
    "vocab_size": VOCAB}, text())
hf("longformer", "encoder", "LongformerModel", {**BERTLIKE, "attention_window": 4}, text())
hf("big-bird", "encoder", "BigBirdModel", {**BERTLIKE, "attention_type": "original_full"},
   text())
hf("roformer", "encoder", "RoFormerModel", {**BERTLIKE, "embedding_size": 64}, text())
#: Nystromformer's landmark path (num_landmarks < segment_means_seq_len) adds the attention mask
#: to (landmarks x sequence) scores, which the (sequence x sequence) mask that this
#: transformers version always builds (a mask of ones when none is given) cannot broadcast to:
#: that path fails in torch itself. With as many landmarks as tokens the model takes its exact
#: softmax path (plus its depthwise convolution of the values).
hf("nystromformer", "encoder", "NystromformerModel",
   {**BERTLIKE, "num_landmarks": SEQ, "segment_means_seq_len": SEQ, "conv_kernel_size": 3},
   text())
hf("ibert", "encoder", "IBertModel", BERTLIKE, text())
hf("megatron-bert", "encoder", "MegatronBertModel", BERTLIKE, text())
hf("ernie", "encoder", "ErnieModel", BERTLIKE, text())
hf("esm", "encoder", "EsmModel", {**BERTLIKE, "vocab_size": 33, "pad_token_id": 1}, text(33))
hf("data2vec-text", "encoder", "Data2VecTextModel", BERTLIKE, text())
hf("rembert", "encoder", "RemBertModel",
   {**BERTLIKE, "input_embedding_size": 32, "output_embedding_size": 32}, text())
hf("splinter", "encoder", "SplinterModel", BERTLIKE, text())
hf("flaubert", "encoder", "FlaubertModel",
   {"emb_dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": VOCAB}, text())
hf("xlm", "encoder", "XLMModel", {"emb_dim": 64, "n_layers": 2, "n_heads": 4,
                                  "vocab_size": VOCAB}, text())
# FNet (aten::fft_fftn) and TAPAS (scatter_reduce with include_self=False) cannot be written
# by torch's TorchScript ONNX exporter at all; two encoders not otherwise in the zoo stand in
# for them: XLM-RoBERTa-XL (pre-norm RoBERTa) and RoCBERT (BERT whose token embedding is
# combined with glyph-shape and pronunciation embeddings of their own id inputs).
hf("xlm-roberta-xl", "encoder", "XLMRobertaXLModel", BERTLIKE, text())
hf("roc-bert", "encoder", "RoCBertModel",
   {**BERTLIKE, "shape_vocab_size": 64, "pronunciation_vocab_size": 48,
    "shape_embed_dim": 32, "pronunciation_embed_dim": 24},
   text() + (InputSpec("input_shape_ids", (BATCH, SEQ), "ids", 64),
             InputSpec("input_pronunciation_ids", (BATCH, SEQ), "ids", 48)))
hf("modernbert", "encoder", "ModernBertModel",
   {**BERTLIKE, "global_attn_every_n_layers": 2, "local_attention": 8}, text(), ci=True)
hf("layoutlm", "encoder", "LayoutLMModel", BERTLIKE, text())
hf("markuplm", "encoder", "MarkupLMModel", BERTLIKE, text())
hf("canine", "encoder", "CanineModel",
   {**BERTLIKE, "num_hash_buckets": 64, "downsampling_rate": 4, "local_transformer_stride": 8},
   text())
hf("clip-text", "encoder", "CLIPTextModel",
   {**BERTLIKE, "projection_dim": 32}, text())
hf("siglip-text", "encoder", "SiglipTextModel", BERTLIKE, text(mask=False))
hf("xmod", "encoder", "XmodModel", {**BERTLIKE, "languages": ["en_XX"],
                                    "default_language": "en_XX"}, text())
hf("luke", "encoder", "LukeModel", {**BERTLIKE, "entity_vocab_size": 16,
                                    "entity_emb_size": 32}, text())

# --- decoders -------------------------------------------------------------------------------
hf("gpt2", "decoder", "GPT2Model", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB,
                                    "n_positions": 64, "use_cache": False}, text(), ci=True)
hf("gpt-neo", "decoder", "GPTNeoModel",
   {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": VOCAB,
    "attention_types": [[["global", "local"], 1]], "window_size": 8,
    "max_position_embeddings": 64, "use_cache": False}, text())
hf("gpt-neox", "decoder", "GPTNeoXModel", LLAMALIKE, text(), ci=True)
hf("gptj", "decoder", "GPTJModel", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8,
                                    "vocab_size": VOCAB, "n_positions": 64,
                                    "use_cache": False}, text())
hf("gpt-bigcode", "decoder", "GPTBigCodeModel",
   {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB, "n_positions": 64,
    "use_cache": False}, text())
hf("codegen", "decoder", "CodeGenModel", {"n_embd": 64, "n_layer": 2, "n_head": 4,
                                          "rotary_dim": 8, "vocab_size": VOCAB,
                                          "n_positions": 64, "use_cache": False}, text())
hf("bloom", "decoder", "BloomModel", {"hidden_size": 64, "n_layer": 2, "n_head": 4,
                                      "vocab_size": VOCAB, "use_cache": False}, text())
hf("opt", "decoder", "OPTModel", {**BERTLIKE, "ffn_dim": 128, "word_embed_proj_dim": 64,
                                  "use_cache": False}, text(), ci=True)
hf("xglm", "decoder", "XGLMModel", {"d_model": 64, "num_layers": 2, "attention_heads": 4,
                                    "ffn_dim": 128, "vocab_size": VOCAB,
                                    "max_position_embeddings": 64, "use_cache": False}, text())
hf("biogpt", "decoder", "BioGptModel", {**BERTLIKE, "use_cache": False}, text())
hf("ctrl", "decoder", "CTRLModel", {"n_embd": 64, "n_layer": 2, "n_head": 4, "dff": 128,
                                    "vocab_size": VOCAB, "n_positions": 64,
                                    "use_cache": False}, text())
hf("mpt", "decoder", "MptModel", {"d_model": 64, "n_heads": 4, "n_layers": 2,
                                  "expansion_ratio": 2, "vocab_size": VOCAB, "max_seq_len": 64,
                                  "use_cache": False}, text())
hf("falcon", "decoder", "FalconModel", {**BERTLIKE, "num_kv_heads": 2, "use_cache": False,
                                        "new_decoder_architecture": True},
   text())
hf("llama", "decoder", "LlamaModel", LLAMALIKE, text(), ci=True)
hf("mistral", "decoder", "MistralModel", LLAMALIKE, text())
hf("qwen2", "decoder", "Qwen2Model", LLAMALIKE, text(), ci=True)
hf("qwen3", "decoder", "Qwen3Model", LLAMALIKE, text())
hf("gemma", "decoder", "GemmaModel", LLAMALIKE, text())
hf("gemma2", "decoder", "Gemma2Model", LLAMALIKE, text())
hf("gemma3", "decoder", "Gemma3TextModel", {**LLAMALIKE, "sliding_window": 8}, text(),
   config="Gemma3TextConfig")
hf("phi", "decoder", "PhiModel", LLAMALIKE, text())
hf("phi3", "decoder", "Phi3Model", LLAMALIKE, text())
hf("stablelm", "decoder", "StableLmModel", LLAMALIKE, text())
hf("starcoder2", "decoder", "Starcoder2Model", LLAMALIKE, text())
hf("olmo", "decoder", "OlmoModel", LLAMALIKE, text())
hf("olmo2", "decoder", "Olmo2Model", LLAMALIKE, text())
hf("cohere", "decoder", "CohereModel", LLAMALIKE, text())
hf("granite", "decoder", "GraniteModel", LLAMALIKE, text())
hf("glm", "decoder", "GlmModel", LLAMALIKE, text())
hf("glm4", "decoder", "Glm4Model", LLAMALIKE, text())
hf("helium", "decoder", "HeliumModel", LLAMALIKE, text())
hf("nemotron", "decoder", "NemotronModel", LLAMALIKE, text())
hf("persimmon", "decoder", "PersimmonModel", LLAMALIKE, text())
hf("smollm3", "decoder", "SmolLM3Model", LLAMALIKE, text())
hf("mamba", "decoder", "MambaModel", {"hidden_size": 32, "num_hidden_layers": 2,
                                      "state_size": 8, "vocab_size": VOCAB,
                                      "use_cache": False}, text(mask=False))
hf("rwkv", "decoder", "RwkvModel", {"hidden_size": 32, "num_hidden_layers": 2,
                                    "attention_hidden_size": 32, "intermediate_size": 64,
                                    "vocab_size": VOCAB, "context_length": 64,
                                    "use_cache": False}, text(mask=False))

# --- mixture of experts ---------------------------------------------------------------------
#: ``batched_mm`` computes each token's chosen experts with gathered weights: traceable, unlike
#: the grouped implementation (``histc``, no ONNX export) or the eager loop over the experts
#: that tokens hit (data-dependent, baked in by tracing).
MOE = {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"}
hf("mixtral", "moe", "MixtralModel", {**LLAMALIKE, **MOE}, text(), ci=True)
hf("qwen2-moe", "moe", "Qwen2MoeModel",
   {**LLAMALIKE, **MOE, "num_experts": 4, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64}, text())
hf("qwen3-moe", "moe", "Qwen3MoeModel",
   {**LLAMALIKE, **MOE, "num_experts": 4, "moe_intermediate_size": 64},
   text())
hf("olmoe", "moe", "OlmoeModel", {**LLAMALIKE, **MOE, "num_experts": 4},
   text())
hf("granitemoe", "moe", "GraniteMoeModel", {**LLAMALIKE, **MOE}, text())
hf("phimoe", "moe", "PhimoeModel", {**LLAMALIKE, **MOE}, text())
hf("jetmoe", "moe", "JetMoeModel",
   {"hidden_size": 64, "num_hidden_layers": 2, "num_key_value_heads": 2, "kv_channels": 16,
    "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
    "vocab_size": VOCAB, "max_position_embeddings": 64, "use_cache": False}, text())
hf("switch-transformers", "moe", "SwitchTransformersModel",
   {**T5LIKE, "num_experts": 4, "expert_capacity": 16, "num_sparse_encoder_layers": 1,
    "num_sparse_decoder_layers": 1}, seq2seq())
hf("nllb-moe", "moe", "NllbMoeModel",
   {**BARTLIKE, "num_experts": 4, "expert_capacity": 16, "encoder_sparse_step": 2,
    "decoder_sparse_step": 2}, seq2seq())

# --- encoder-decoders -----------------------------------------------------------------------
hf("t5", "encoder-decoder", "T5Model", T5LIKE, seq2seq(), ci=True)
hf("mt5", "encoder-decoder", "MT5Model", T5LIKE, seq2seq())
hf("umt5", "encoder-decoder", "UMT5Model", T5LIKE, seq2seq())
hf("longt5", "encoder-decoder", "LongT5Model", {**T5LIKE, "local_radius": 4}, seq2seq())
hf("bart", "encoder-decoder", "BartModel", BARTLIKE, seq2seq(), ci=True)
hf("mbart", "encoder-decoder", "MBartModel", BARTLIKE, seq2seq())
hf("pegasus", "encoder-decoder", "PegasusModel", BARTLIKE, seq2seq())
#: Marian's pad and decoder-start id is the last of its vocabulary (58100 by default).
hf("marian", "encoder-decoder", "MarianModel",
   {**BARTLIKE, "decoder_vocab_size": VOCAB, "pad_token_id": VOCAB - 1,
    "decoder_start_token_id": VOCAB - 1}, seq2seq())
hf("blenderbot", "encoder-decoder", "BlenderbotModel", BARTLIKE, seq2seq())
hf("blenderbot-small", "encoder-decoder", "BlenderbotSmallModel", BARTLIKE, seq2seq())
hf("m2m100", "encoder-decoder", "M2M100Model", BARTLIKE, seq2seq())
hf("plbart", "encoder-decoder", "PLBartModel", BARTLIKE, seq2seq())
hf("mvp", "encoder-decoder", "MvpModel", BARTLIKE, seq2seq())
hf("led", "encoder-decoder", "LEDModel",
   {**BARTLIKE, "attention_window": 4, "max_encoder_position_embeddings": 64,
    "max_decoder_position_embeddings": 64}, seq2seq())
hf("prophetnet", "encoder-decoder", "ProphetNetModel",
   {"hidden_size": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "num_encoder_layers": 2,
    "num_decoder_layers": 2, "num_encoder_attention_heads": 4,
    "num_decoder_attention_heads": 4, "vocab_size": VOCAB, "ngram": 2,
    "max_position_embeddings": 64, "use_cache": False}, seq2seq())
hf("bigbird-pegasus", "encoder-decoder", "BigBirdPegasusModel",
   {**BARTLIKE, "attention_type": "original_full"}, seq2seq())

# --- vision ---------------------------------------------------------------------------------
hf("vit", "vision", "ViTModel", VIT, image(), ci=True)
hf("deit", "vision", "DeiTModel", VIT, image())
hf("beit", "vision", "BeitModel", {**VIT, "use_relative_position_bias": True}, image())
hf("data2vec-vision", "vision", "Data2VecVisionModel", VIT, image())
hf("dinov2", "vision", "Dinov2Model", VIT, image(), ci=True)
hf("vit-msn", "vision", "ViTMSNModel", VIT, image())
hf("ijepa", "vision", "IJepaModel", VIT, image())
hf("yolos", "vision", "YolosModel", {**VIT, "num_detection_tokens": 4, "image_size": [32, 32]},
   image())
hf("clip-vision", "vision", "CLIPVisionModel", VIT, image())
hf("siglip-vision", "vision", "SiglipVisionModel", VIT, image())
hf("vitdet", "vision", "VitDetModel", {**VIT, "pretrain_image_size": 32}, image())
hf("swin", "vision", "SwinModel", {**STAGES, "embed_dim": 16, "depths": [1, 1],
                                   "num_heads": [2, 2], "window_size": 4, "patch_size": 4},
   image(), ci=True)
hf("swinv2", "vision", "Swinv2Model", {**STAGES, "embed_dim": 16, "depths": [1, 1],
                                       "num_heads": [2, 2], "window_size": 4, "patch_size": 4},
   image())
hf("convnext-hf", "vision", "ConvNextModel", {**STAGES, "hidden_sizes": [16, 32],
                                              "depths": [1, 1], "num_stages": 2}, image())
hf("convnextv2", "vision", "ConvNextV2Model", {**STAGES, "hidden_sizes": [16, 32],
                                               "depths": [1, 1], "num_stages": 2}, image())
hf("resnet-hf", "vision", "ResNetModel", {"embedding_size": 16, "hidden_sizes": [16, 32],
                                          "depths": [1, 1]}, image())
hf("regnet", "vision", "RegNetModel", {"embedding_size": 16, "hidden_sizes": [16, 32],
                                       "depths": [1, 1], "groups_width": 8}, image())
hf("bit", "vision", "BitModel", {"embedding_size": 16, "hidden_sizes": [16, 32],
                                 "depths": [1, 1], "num_groups": 8}, image())
hf("mobilevit", "vision", "MobileViTModel",
   {**STAGES, "hidden_sizes": [32, 32, 32], "neck_hidden_sizes": [8, 8, 16, 16, 16, 32, 64],
    "num_attention_heads": 2, "patch_size": 2}, image(), ci=True)
#: MobileViTV2 unfolds 2x2 patches at stride 32 (its smallest image is 64 pixels) and folds
#: them back with torch.nn.functional.fold: ONNX Col2Im, opset 18.
hf("mobilevitv2", "vision", "MobileViTV2Model",
   {**STAGES, "image_size": 64, "width_multiplier": 0.5}, image(64), opset=18)
hf("levit", "vision", "LevitModel", {"image_size": 32, "hidden_sizes": [32, 48],
                                     "num_attention_heads": [2, 2], "depths": [1, 1],
                                     "key_dim": [8, 8], "drop_path_rate": 0,
                                     "mlp_ratio": [2, 2], "attention_ratio": [2, 2],
                                     "down_ops": [["Subsample", 8, 2, 4, 2, 2]]}, image())
hf("poolformer", "vision", "PoolFormerModel", {"hidden_sizes": [16, 32], "depths": [1, 1],
                                               "num_encoder_blocks": 2, "patch_sizes": [7, 3],
                                               "strides": [4, 2], "padding": [2, 1]}, image())
hf("segformer", "vision", "SegformerModel",
   {"num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1], "hidden_sizes": [16, 32],
    "patch_sizes": [7, 3], "strides": [4, 2], "num_attention_heads": [1, 2],
    "mlp_ratios": [2, 2]}, image(), ci=True)
hf("efficientnet-hf", "vision", "EfficientNetModel",
   {"image_size": 32, "width_coefficient": 0.25, "depth_coefficient": 0.25,
    "hidden_dim": 320}, image())  # hidden_dim: the top convolution's 1280 channels x 0.25
hf("mobilenet-v1-hf", "vision", "MobileNetV1Model", {"image_size": 32, "depth_multiplier": 0.25},
   image())
hf("mobilenet-v2-hf", "vision", "MobileNetV2Model", {"image_size": 32, "depth_multiplier": 0.25},
   image())
#: CvT stage s reads its layers' drop-path rate at index s of a list as long as its depth:
#: stage 1 needs 2 layers.
hf("cvt", "vision", "CvtModel", {"embed_dim": [16, 32], "num_heads": [1, 2], "depth": [1, 2],
                                 "patch_sizes": [7, 3], "patch_stride": [4, 2],
                                 "patch_padding": [2, 1], "mlp_ratio": [2.0, 2.0],
                                 "attention_drop_rate": [0.0, 0.0], "drop_rate": [0.0, 0.0],
                                 "drop_path_rate": [0.0, 0.0], "qkv_bias": [True, True],
                                 "cls_token": [False, True], "qkv_projection_method":
                                 ["dw_bn", "dw_bn"], "kernel_qkv": [3, 3],
                                 "padding_kv": [1, 1], "stride_kv": [2, 2],
                                 "padding_q": [1, 1], "stride_q": [1, 1]}, image())
hf("focalnet", "vision", "FocalNetModel", {**STAGES, "embed_dim": 16, "depths": [1, 1],
                                           "focal_levels": [2, 2], "focal_windows": [3, 3],
                                           "patch_size": 4}, image())
hf("pvt", "vision", "PvtModel", {"image_size": 32, "num_encoder_blocks": 2, "depths": [1, 1],
                                 "sequence_reduction_ratios": [2, 1], "hidden_sizes": [16, 32],
                                 "patch_sizes": [4, 2], "strides": [4, 2],
                                 "num_attention_heads": [1, 2], "mlp_ratios": [2, 2]}, image())
hf("pvt-v2", "vision", "PvtV2Model", {"image_size": 32, "num_encoder_blocks": 2,
                                      "depths": [1, 1], "sr_ratios": [2, 1],
                                      "hidden_sizes": [16, 32], "patch_sizes": [7, 3],
                                      "strides": [4, 2], "num_attention_heads": [1, 2],
                                      "mlp_ratios": [2, 2]}, image())
hf("hiera", "vision", "HieraModel", {"image_size": [32, 32], "embed_dim": 16, "depths": [1, 1],
                                     "num_heads": [1, 2], "patch_stride": [4, 4],
                                     "patch_size": [7, 7], "patch_padding": [3, 3],
                                     "masked_unit_size": [2, 2], "query_stride": [2, 2],
                                     "masked_unit_attention": [True, False],
                                     "embed_dim_multiplier": 2.0, "num_query_pool": 1},
   image())
hf("glpn", "vision", "GLPNModel", {"num_encoder_blocks": 2, "depths": [1, 1],
                                   "sr_ratios": [2, 1], "hidden_sizes": [16, 32],
                                   "patch_sizes": [7, 3], "strides": [4, 2],
                                   "num_attention_heads": [1, 2], "mlp_ratios": [2, 2]},
   image())
hf("swiftformer", "vision", "SwiftFormerModel", {"depths": [1, 1, 1, 1],
                                                 "embed_dims": [16, 16, 32, 32]}, image())
hf("textnet", "vision", "TextNetModel", {}, image())

# --- speech encoders ------------------------------------------------------------------------
hf("wav2vec2", "speech", "Wav2Vec2Model", WAV2VEC, audio(), ci=True)
hf("hubert", "speech", "HubertModel", WAV2VEC, audio())
hf("wavlm", "speech", "WavLMModel", {**WAV2VEC, "num_buckets": 32, "max_bucket_distance": 64},
   audio())
hf("unispeech", "speech", "UniSpeechModel", WAV2VEC, audio())
hf("unispeech-sat", "speech", "UniSpeechSatModel", WAV2VEC, audio())
hf("data2vec-audio", "speech", "Data2VecAudioModel", {**WAV2VEC, "conv_pos_kernel_size": 5,
                                                      "num_conv_pos_embeddings": 5}, audio())
hf("wav2vec2-conformer", "speech", "Wav2Vec2ConformerModel",
   {**WAV2VEC, "position_embeddings_type": "rotary", "conv_depthwise_kernel_size": 7},
   audio())
hf("sew", "speech", "SEWModel", {**WAV2VEC, "squeeze_factor": 2}, audio())
hf("sew-d", "speech", "SEWDModel", {**WAV2VEC, "squeeze_factor": 2, "position_buckets": 16,
                                    "max_relative_positions": 32}, audio())
hf("whisper", "speech", "WhisperModel",
   {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
    "vocab_size": VOCAB, "num_mel_bins": 16, "max_source_positions": 16,
    "max_target_positions": 32, "use_cache": False, "pad_token_id": 0,
    "decoder_start_token_id": 1},
   # with a decoder mask: without one, transformers looks for packed sequences in the
   # position ids with torch.diff, which has no ONNX export
   (InputSpec("input_features", (1, 16, 32)),
    InputSpec("decoder_input_ids", (1, 8), "ids", VOCAB),
    InputSpec("decoder_attention_mask", (1, 8), "mask")))
hf("speech-to-text", "speech", "Speech2TextModel",
   {**BARTLIKE, "input_feat_per_channel": 16, "num_conv_layers": 2, "conv_channels": 32,
    "max_source_positions": 64, "max_target_positions": 64},
   (InputSpec("input_features", (1, 32, 16)),
    InputSpec("decoder_input_ids", (1, 8), "ids", VOCAB)))
hf("audio-spectrogram-transformer", "speech", "ASTModel",
   {**VIT, "num_mel_bins": 16, "max_length": 32, "frequency_stride": 8, "time_stride": 8,
    "patch_size": 8}, (InputSpec("input_values", (1, 32, 16)),), config="ASTConfig")
