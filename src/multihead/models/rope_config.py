"""RoPE settings of a Hugging Face config.json -> (rope_theta, RopeScaling | None), shared by the
decoder families.

Two spellings exist: transformers 4's top-level `rope_theta` + `rope_scaling`, and transformers
5's `rope_parameters` (which holds rope_theta too). Published files often carry both (a Llama
3.1 config re-saved by transformers 5): they load when every key they share has the same value
("type" and "rope_type" are one key); a key whose values differ is refused naming both. Every
scaling type Hugging Face defines for these families is read: default, linear, dynamic, llama3,
yarn, longrope (Phi-3's "su" is its older name); any other is refused naming the file, key and
value.
"""

from __future__ import annotations

import math

from ..positional import RopeScaling
from .fields import Fields

# RoPE base: above 1 (a base of 1 rotates every pair at the same speed), at most 1e12 (released
# models use 1e4 .. 1e8). Scaling factors: context multipliers in [1, 1e4].
THETA_RANGE = (1.0, 1e12)
MAX_FACTOR = 1e4
KINDS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ROPE_KEYS = {
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "partial_rotary_factor",
    "low_freq_factor",  # llama3
    "high_freq_factor",
    "beta_fast",  # yarn
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "attention_factor",  # yarn, longrope
    "short_factor",  # longrope
    "long_factor",
    "rope_freqs",  # llama.cpp's per-dimension divisors (a GGUF's rope_freqs tensor)
}


def _merge(f: Fields) -> tuple[dict, str]:
    """The RoPE object (rope_scaling and rope_parameters merged) and the key it came from.
    A key both give with different values is an error."""
    scaling, parameters = f.config.get("rope_scaling"), f.config.get("rope_parameters")
    for key, value in (("rope_scaling", scaling), ("rope_parameters", parameters)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(
                f"config.json ({f.model_type}): {key} must be an object, got {value!r}"
            )
    scaling, parameters = dict(scaling or {}), dict(parameters or {})
    for spelling in (scaling, parameters):  # "type" is transformers 4's name of rope_type
        if "type" in spelling and "rope_type" not in spelling:
            spelling["rope_type"] = spelling.pop("type")
    for key in sorted(set(scaling) & set(parameters)):
        if scaling[key] != parameters[key]:
            raise ValueError(
                f"config.json ({f.model_type}): rope_scaling.{key} {scaling[key]!r} and "
                f"rope_parameters.{key} {parameters[key]!r} disagree; give one"
            )
    where = "rope_scaling" if scaling and not parameters else "rope_parameters"
    return scaling | parameters, where


def _theta(f: Fields, p: Fields, where: str) -> float:
    """rope_theta from the RoPE object or the top level; both present and different is an
    error, not a silent choice."""
    low, high = THETA_RANGE
    inner = p.number("rope_theta", None, positive=False, minimum=low, maximum=high)
    outer = f.number("rope_theta", None, positive=False, minimum=low, maximum=high)
    if inner is not None and outer is not None and inner != outer:
        raise ValueError(
            f"config.json ({f.model_type}): rope_theta {outer:g} disagrees with "
            f"{where}.rope_theta {inner:g}; give one"
        )
    theta = inner if inner is not None else outer
    return 10000.0 if theta is None else theta


def rotary_fraction(f: Fields, default: float = 1.0) -> float:
    """partial_rotary_factor (top level or in the RoPE object; equal if both): the fraction of
    each head that rotates."""
    params, where = _merge(f)
    values = {
        key: v
        for key, v in (
            ("partial_rotary_factor", f.config.get("partial_rotary_factor")),
            (f"{where}.partial_rotary_factor", params.get("partial_rotary_factor")),
        )
        if v is not None
    }
    if len(set(values.values())) > 1:
        both = " and ".join(f"{k} {v!r}" for k, v in values.items())
        raise ValueError(f"config.json ({f.model_type}): {both} disagree")
    if not values:
        return default
    value = next(iter(values.values()))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(
            f"config.json ({f.model_type}): partial_rotary_factor must be a number in (0, 1], "
            f"got {value!r}"
        )
    return float(value)


def _factors(p: Fields, key: str) -> tuple[float, ...]:
    values = p.config.get(key)
    if not isinstance(values, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        for v in values
    ):
        raise ValueError(f"config.json ({p.model_type}): {key} must be a list of positive numbers")
    return tuple(float(v) for v in values)


def _yarn_attention(p: Fields, factor: float) -> float | None:
    """YaRN's attention factor: as given, or from mscale / mscale_all_dim (DeepSeek's form);
    None: the default 0.1 ln(factor) + 1."""
    given = p.number("attention_factor", None)
    mscale, mscale_all = p.number("mscale", None), p.number("mscale_all_dim", None)
    if given is not None or not (mscale and mscale_all):
        return given

    def get(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    return get(mscale) / get(mscale_all)


def rope_settings(
    f: Fields, max_positions: int, *, partial: bool = False
) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from either spelling; unknown types and keys refused by name,
    numbers range-checked, contradicting spellings refused. `partial`: whether the family
    rotates part of each head (else partial_rotary_factor other than 1 is refused)."""
    params, where = _merge(f)
    unknown = sorted(set(params) - ROPE_KEYS)
    if unknown:
        raise ValueError(
            f"config.json ({f.model_type}): {where} field(s) {', '.join(unknown)} are not "
            "supported (per-layer RoPE parameters?)"
        )
    p = Fields(params, f"{f.model_type} {where}")
    if not partial:
        p.refuse("partial_rotary_factor", lambda v: v == 1, "RoPE on part of each head")
        f.refuse("partial_rotary_factor", lambda v: v == 1, "RoPE on part of each head")
    theta = _theta(f, p, where)
    kind = params.get("rope_type", "default")
    kind = "longrope" if kind == "su" else kind
    if kind == "default" and "rope_freqs" not in params:
        return theta, None
    if kind not in KINDS:
        raise ValueError(
            f"config.json ({f.model_type}): {where}.rope_type {kind!r} is not supported; "
            f"multihead implements {', '.join(KINDS)}"
        )
    if "rope_freqs" in params:  # written by the GGUF reader: the divisors themselves
        return theta, RopeScaling("factors", 1.0, short_factor=_factors(p, "rope_freqs"))
    if kind == "dynamic":  # grows past max_position_embeddings, as transformers does
        factor = p.number("factor", minimum=1.0, maximum=MAX_FACTOR)
        return theta, RopeScaling("dynamic", factor, max_positions)
    if kind == "linear":
        return theta, RopeScaling("linear", p.number("factor", minimum=1.0, maximum=MAX_FACTOR))
    # the pretraining length: Phi-3 keeps it at the top level, which wins (as in transformers)
    original = f.int("original_max_position_embeddings", None)
    if original is None:
        original = p.int("original_max_position_embeddings", max_positions)
    if kind == "longrope":
        factor = p.number("factor", None, maximum=MAX_FACTOR)
        return theta, RopeScaling(
            "longrope",
            max_positions / original if factor is None else factor,
            original,
            attention_factor=p.number("attention_factor", None),
            short_factor=_factors(p, "short_factor"),
            long_factor=_factors(p, "long_factor"),
        )
    if kind == "yarn":
        factor = p.number("factor", None, minimum=1.0, maximum=MAX_FACTOR)
        factor = max_positions / original if factor is None else factor
        truncate = params.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ValueError(
                f"config.json ({f.model_type}): {where}.truncate must be true or false"
            )
        return theta, RopeScaling(
            "yarn",
            factor,
            original,
            beta_fast=p.number("beta_fast", None) or 32.0,
            beta_slow=p.number("beta_slow", None) or 1.0,
            truncate=truncate,
            attention_factor=_yarn_attention(p, factor),
        )
    factor = p.number("factor", minimum=1.0, maximum=MAX_FACTOR)
    low = p.number("low_freq_factor", maximum=MAX_FACTOR)
    high = p.number("high_freq_factor", maximum=MAX_FACTOR)
    if not low < high:  # the wavelength bands between them would be empty or reversed
        raise ValueError(
            f"config.json ({f.model_type}): {where} low_freq_factor {low:g} must be below "
            f"high_freq_factor {high:g}"
        )
    return theta, RopeScaling(
        "llama3", factor, original, low_freq_factor=low, high_freq_factor=high
    )
