"""Model architecture descriptions: exact public shapes of the transformer models the framework knows.

This is the lowest layer of the project (`quant/` sits below `planner/`), so the reference forward pass, the quantizer,
the cold-start planner and the Voltron planner all read the same `ModelSpec`. It is also the structured-config schema of
the Hydra `model` group (`conf/model/*.yaml`): a typo or an out-of-range value fails before any work starts.

Shapes are taken from each model's public `config.json` on the Hugging Face hub (fields named in comments). Layer
variants (Voltron §2.1, Table 3): attention is MHA when n_kv_heads == n_heads, GQA otherwise; sliding-window attention
(SWA) layers follow `sliding_window_pattern` (gemma-3: 5 local layers then 1 global); an FFN is MoE when
`n_experts > 0`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")     # names that become file / directory names
PACKAGE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")   # a top-level module name (no dots: finding it imports nothing)
MAX_DIM = 1 << 20                              # largest layer count / width / vocabulary a ModelSpec accepts


def check_name(value, key: str) -> str:
    """A name that becomes part of a path: 1..96 characters of [A-Za-z0-9_.-], not '.'-only and no '..'."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or ".." in value or value.startswith(".") \
            or len(value) > 96:
        raise ValueError(f"{key}: must be a name of 1..96 characters [A-Za-z0-9_.-], not starting with '.', "
                         f"without '..' (got {value!r})")
    return value


class WeightSource(str, Enum):
    real = "real"    # weights exist on this machine (GGUF file inside a pip package)
    twin = "twin"    # no weights here: per-channel statistics come from the statistical twin of the real model
    synthetic = "synthetic"   # weights sampled from the twin, generated on demand as GGUF under outputs/ (quant.synth)


@dataclass
class ModelSpec:
    name: str = "???"                  # short id, equals the conf/model file name
    hf_id: str = ""                    # public source of the shapes (Hugging Face repo id)
    n_layers: int = 0                  # num_hidden_layers
    d_model: int = 0                   # hidden_size
    d_ffn: int = 0                     # intermediate_size (dense FFN); 0 for pure-MoE layers
    n_heads: int = 0                   # num_attention_heads
    n_kv_heads: int = 0                # num_key_value_heads
    head_dim: int = 0                  # head_dim (d_model // n_heads unless the config says otherwise)
    vocab: int = 0                     # vocab_size
    tied_embeddings: bool = False      # tie_word_embeddings
    rope_base: float = 10000.0         # rope_theta
    norm_eps: float = 1e-5             # rms_norm_eps
    sliding_window: int = 0            # tokens; 0 = no SWA layers
    sliding_window_pattern: int = 0    # every N-th layer global, the others SWA (gemma-3: 6); 0 = all SWA if window>0
    n_experts: int = 0                 # MoE routed experts per layer (0 = dense FFN)
    n_experts_active: int = 0          # experts per token (top-k)
    d_expert_ffn: int = 0              # moe_intermediate_size
    d_shared_expert_ffn: int = 0       # shared_expert_intermediate_size (Qwen-MoE), 0 = none
    weights: WeightSource = WeightSource.twin
    gguf_package: str = ""             # pip package holding the GGUF file (real weights)
    gguf_file: str = ""                # file name inside that package

    def __post_init__(self) -> None:
        check_name(self.name, "model.name")
        try:                                 # a YAML file read without Hydra gives the weight source as a string
            self.weights = WeightSource(self.weights)
        except ValueError:
            raise ValueError(f"model.weights must be one of {[w.value for w in WeightSource]} "
                             f"(got {self.weights!r})") from None
        for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab"):
            if getattr(self, key) <= 0:
                raise ValueError(f"model.{key} must be > 0 (got {getattr(self, key)})")
        for key in ("n_layers", "d_model", "d_ffn", "n_heads", "n_kv_heads", "head_dim", "vocab", "sliding_window",
                    "sliding_window_pattern", "n_experts", "n_experts_active", "d_expert_ffn", "d_shared_expert_ffn"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIM:
                raise ValueError(f"model.{key} must be an integer in 0..{MAX_DIM} (got {v!r})")
        for key in ("rope_base", "norm_eps"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"model.{key} must be a finite number > 0 (got {v!r})")
        if self.gguf_package and not PACKAGE_RE.fullmatch(self.gguf_package):
            raise ValueError(f"model.gguf_package must be a top-level package name (got {self.gguf_package!r})")
        if self.gguf_file:
            check_name(self.gguf_file, "model.gguf_file")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads ({self.n_heads}) must be a multiple of "
                             f"model.n_kv_heads ({self.n_kv_heads})")
        if self.d_ffn <= 0 and self.n_experts <= 0:
            raise ValueError("model.d_ffn must be > 0 for a dense model (or set model.n_experts for MoE)")
        if self.n_experts and not (0 < self.n_experts_active <= self.n_experts and self.d_expert_ffn > 0):
            raise ValueError("model.n_experts_active must be in 1..n_experts and model.d_expert_ffn > 0 for MoE")
        if self.weights == WeightSource.real and not (self.gguf_package and self.gguf_file):
            raise ValueError("model.weights=real needs model.gguf_package and model.gguf_file")

    # ---- derived shapes -------------------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def attention_kind(self) -> str:
        return "MHA" if self.n_kv_heads == self.n_heads else "GQA"

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_swa_layer(self, layer: int) -> bool:
        """True when `layer` (0-based) uses sliding-window attention."""
        if self.sliding_window <= 0:
            return False
        if self.sliding_window_pattern <= 0:
            return True
        return (layer + 1) % self.sliding_window_pattern != 0

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Per-layer linear weights as (out_channels, in_channels); MoE experts counted individually."""
        d, f = self.d_model, self.d_ffn
        shapes = {
            "attn_q": (self.q_dim, d),
            "attn_k": (self.kv_dim, d),
            "attn_v": (self.kv_dim, d),
            "attn_output": (d, self.q_dim),
        }
        if self.is_moe:
            e = self.d_expert_ffn
            for x in range(self.n_experts):
                shapes[f"expert{x}_gate"] = (e, d)
                shapes[f"expert{x}_up"] = (e, d)
                shapes[f"expert{x}_down"] = (d, e)
            shapes["router"] = (self.n_experts, d)
            if self.d_shared_expert_ffn:
                s = self.d_shared_expert_ffn
                shapes.update(shared_gate=(s, d), shared_up=(s, d), shared_down=(d, s))
        else:
            shapes.update(ffn_gate=(f, d), ffn_up=(f, d), ffn_down=(d, f))
        return shapes

    def layer_params(self) -> int:
        """Weights in one transformer block (linear layers + 2 norms)."""
        return sum(o * i for o, i in self.linear_shapes().values()) + 2 * self.d_model

    def embedding_params(self) -> int:
        return self.vocab * self.d_model * (1 if self.tied_embeddings else 2)

    def total_params(self) -> int:
        return self.n_layers * self.layer_params() + self.embedding_params() + self.d_model

    def output_channels_per_layer(self) -> int:
        """Number of per-output-channel quantization units (rows) in one block's linear layers."""
        return sum(o for o, _ in self.linear_shapes().values())


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def conf_yaml(group: str, name: str, conf_dir: str | Path | None = None) -> dict:
    """conf/<group>/<name>.yaml as a plain dict without its Hydra `defaults` list: the one reader of a config file
    outside Hydra (scripts, tests, cluster workers, reports)."""
    from omegaconf import OmegaConf  # only this reader needs it: the rest of the module is the standard library

    path = Path(conf_dir or CONF_DIR) / group / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{group}={name}: no {path}")
    d = OmegaConf.to_container(OmegaConf.load(path))
    d.pop("defaults", None)
    return d


def model_spec(name: str) -> ModelSpec:
    """ModelSpec of conf/model/<name>.yaml without Hydra (for scripts, tests and `python -m quant.twin_fit`)."""
    return ModelSpec(**conf_yaml("model", name))


def smollm2_spec() -> ModelSpec:
    return model_spec("smollm2_135m")
