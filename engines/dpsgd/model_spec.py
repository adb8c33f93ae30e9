"""Model specs: a small JSON language for MLPs, checked without torch and built with it.

A spec is either the shorthand ``{"hidden": [128, 64, 32], "activation": "relu",
"norm": "layernorm", "dropout": 0.0}`` or an explicit ``{"layers": [...]}`` list of
``{"type": "linear", "out": 64}``, ``{"type": "layernorm"}``, ``{"type": "groupnorm",
"groups": 8}``, ``{"type": "batchnorm"}``, an activation (``relu``, ``tanh``, ``gelu``,
``sigmoid``, ``elu``, ``leaky_relu``, ``silu``) or ``{"type": "dropout", "p": 0.1}``.
The output layer (a linear layer to 1 output, or one per class) is appended.

BatchNorm mixes the samples of a batch, so per-sample gradients (and with them DP-SGD's
clipping) are undefined. Like Opacus's ``ModuleValidator.fix``, a ``batchnorm`` layer is
replaced by ``GroupNorm(G, C)`` with G the largest divisor of C up to 32 (Opacus uses
min(32, C)) that leaves each group two channels (a one-channel group normalises to 0 on
a 2-D input)
and the replacement is reported; with ``"fix_model": false`` the request is refused. The
built module is then checked by Opacus's ``ModuleValidator.validate``.
"""

from __future__ import annotations

ACTIVATIONS = ("relu", "tanh", "gelu", "sigmoid", "elu", "leaky_relu", "silu")
NORMS = ("layernorm", "groupnorm", "batchnorm", "none")
MAX_WIDTH = 4096
MAX_LAYERS = 64
MAX_PARAMETERS = 5_000_000
DEFAULT_MODEL = {"hidden": [128, 64, 32], "activation": "relu", "norm": "layernorm", "dropout": 0.0}


class ModelSpecError(ValueError):
    pass


def _int(v, what: str, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ModelSpecError(f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _shorthand(model: dict) -> list[dict]:
    unknown = set(model) - {"hidden", "activation", "norm", "dropout"}
    if unknown:
        raise ModelSpecError(f"unknown model key(s): {', '.join(sorted(unknown))}")
    hidden = model.get("hidden", DEFAULT_MODEL["hidden"])
    if not isinstance(hidden, list) or len(hidden) > MAX_LAYERS // 4:
        raise ModelSpecError(f"hidden must be a list of at most {MAX_LAYERS // 4} layer widths")
    act = model.get("activation", "relu")
    if act not in ACTIVATIONS:
        raise ModelSpecError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    norm = model.get("norm", "layernorm")
    if norm not in NORMS:
        raise ModelSpecError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    p = model.get("dropout", 0.0)
    layers = []
    for i, width in enumerate(hidden):
        layers.append({"type": "linear", "out": _int(width, f"hidden[{i}]", 1, MAX_WIDTH)})
        if norm != "none":
            layers.append({"type": norm})
        layers.append({"type": act})
        if p:
            layers.append({"type": "dropout", "p": p})
    return layers


def _default_groups(c: int) -> int:
    """The most groups (at most 32, as Opacus) that leave each at least two channels."""
    return max(g for g in range(1, min(32, max(c // 2, 1)) + 1) if c % g == 0)


def expand_model(model, n_inputs: int, n_outputs: int, *, fix: bool = True) -> tuple[list[dict], list[str]]:
    """The checked layer list (with sizes resolved and the output layer appended) and the
    fixes applied. Raises ModelSpecError with what is wrong."""
    if model is None:
        model = DEFAULT_MODEL
    if not isinstance(model, dict):
        raise ModelSpecError("must be an object: {\"hidden\": [...]} or {\"layers\": [...]}")
    if "layers" in model:
        if set(model) != {"layers"}:
            raise ModelSpecError("with layers, give no other model key")
        raw = model["layers"]
        if not isinstance(raw, list) or len(raw) > MAX_LAYERS:
            raise ModelSpecError(f"layers must be a list of at most {MAX_LAYERS} layers")
    else:
        raw = _shorthand(model)
    if n_inputs < 1:
        raise ModelSpecError("the model has no input features")
    out, fixes = [], []
    width, params = n_inputs, 0
    for i, layer in enumerate(raw):
        where = f"layer {i}"
        if not isinstance(layer, dict) or not isinstance(layer.get("type"), str):
            raise ModelSpecError(f"{where}: must be an object with a type")
        typ, extra = layer["type"], set(layer) - {"type"}
        if typ == "linear":
            if extra - {"out"}:
                raise ModelSpecError(f"{where}: unknown key(s) {sorted(extra - {'out'})}")
            n = _int(layer.get("out"), f"{where}: out", 1, MAX_WIDTH)
            out.append({"type": "linear", "in": width, "out": n})
            params += width * n + n
            width = n
        elif typ in ("layernorm", "groupnorm", "batchnorm"):
            if width < 2:
                raise ModelSpecError(f"{where}: a normalisation layer needs a width of at least 2, got {width}")
            if typ == "batchnorm":
                if not fix:
                    raise ModelSpecError(
                        f"{where}: BatchNorm mixes the samples of a batch, so per-sample gradients are undefined "
                        "and DP-SGD cannot clip them; use layernorm or groupnorm, or allow the fix (fix_model: true) "
                        "that replaces it with GroupNorm")
                groups = _default_groups(width)
                fixes.append(f"{where}: BatchNorm1d({width}) replaced by GroupNorm({groups}, {width}) "
                             "(BatchNorm is incompatible with per-sample clipping; as Opacus ModuleValidator.fix)")
                typ, layer = "groupnorm", {"type": "groupnorm", "groups": groups}
            if typ == "groupnorm":
                groups = _int(layer.get("groups", _default_groups(width)), f"{where}: groups", 1, width // 2)
                if width % groups:
                    raise ModelSpecError(f"{where}: groups ({groups}) must divide the layer width ({width})")
                out.append({"type": "groupnorm", "groups": groups, "width": width})
            else:
                out.append({"type": "layernorm", "width": width})
            params += 2 * width
        elif typ in ACTIVATIONS:
            out.append({"type": typ})
        elif typ == "dropout":
            p = layer.get("p", 0.1)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise ModelSpecError(f"{where}: dropout p must be in [0, 1), got {p!r}")
            out.append({"type": "dropout", "p": float(p)})
        else:
            raise ModelSpecError(f"{where}: unknown layer type {typ!r}; known: linear, layernorm, groupnorm, "
                                 f"batchnorm, dropout, {', '.join(ACTIVATIONS)}")
    out.append({"type": "linear", "in": width, "out": n_outputs})
    params += width * n_outputs + n_outputs
    if params > MAX_PARAMETERS:
        raise ModelSpecError(f"the model has {params:,} parameters; at most {MAX_PARAMETERS:,}")
    return out, fixes


def n_parameters(layers: list[dict]) -> int:
    total = 0
    for layer in layers:
        if layer["type"] == "linear":
            total += layer["in"] * layer["out"] + layer["out"]
        elif layer["type"] in ("layernorm", "groupnorm"):
            total += 2 * layer["width"]
    return total


def build(layers: list[dict]):
    """The torch module of an expanded spec (``torch.nn.Sequential``), checked by Opacus."""
    import torch.nn as nn
    from opacus.validators import ModuleValidator

    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid, "elu": nn.ELU,
            "leaky_relu": nn.LeakyReLU, "silu": nn.SiLU}
    mods = []
    for layer in layers:
        t = layer["type"]
        if t == "linear":
            mods.append(nn.Linear(layer["in"], layer["out"]))
        elif t == "layernorm":
            mods.append(nn.LayerNorm(layer["width"]))
        elif t == "groupnorm":
            mods.append(nn.GroupNorm(layer["groups"], layer["width"]))
        elif t == "dropout":
            mods.append(nn.Dropout(layer["p"]))
        else:
            mods.append(acts[t]())
    model = nn.Sequential(*mods)
    problems = ModuleValidator.validate(model, strict=False)
    if problems:  # pragma: no cover - expand_model never produces such a module
        raise ModelSpecError("; ".join(str(p) for p in problems))
    return model


def describe(layers: list[dict]) -> str:
    parts = []
    for layer in layers:
        if layer["type"] == "linear":
            parts.append(f"Linear({layer['in']}->{layer['out']})")
        elif layer["type"] == "groupnorm":
            parts.append(f"GroupNorm({layer['groups']})")
        elif layer["type"] == "dropout":
            parts.append(f"Dropout({layer['p']:g})")
        else:
            parts.append({"layernorm": "LayerNorm"}.get(layer["type"], layer["type"]))
    return " ".join(parts)

