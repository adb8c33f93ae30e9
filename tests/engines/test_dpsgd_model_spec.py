"""The MLP spec language (engines/dpsgd/model_spec.py): the BatchNorm fix, Opacus's
validator on every module it builds, parameter counts, and bad specs refused with a
reason."""

import pytest
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opacus.validators import ModuleValidator

from engines.dpsgd.model_spec import MAX_PARAMETERS, ModelSpecError, build, describe, expand_model, n_parameters
from tests.engines.dpsgd_helpers import one_thread  # noqa: F401  (autouse)


def test_batchnorm_is_replaced_by_groupnorm_and_reported():
    layers, fixes = expand_model({"layers": [{"type": "linear", "out": 12}, {"type": "batchnorm"},
                                             {"type": "relu"}]}, 5, 1, fix=True)
    assert [layer["type"] for layer in layers] == ["linear", "groupnorm", "relu", "linear"]
    gn = layers[1]
    assert gn["width"] == 12 and 12 % gn["groups"] == 0 and 12 // gn["groups"] >= 2
    assert len(fixes) == 1 and "BatchNorm" in fixes[0] and "GroupNorm" in fixes[0]
    model = build(layers)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert isinstance(model[1], nn.GroupNorm) and model[1].num_groups == gn["groups"]


def test_batchnorm_in_the_shorthand_is_fixed_too():
    layers, fixes = expand_model({"hidden": [8, 4], "norm": "batchnorm"}, 3, 2)
    assert [layer["type"] for layer in layers].count("groupnorm") == 2 and len(fixes) == 2
    assert "batchnorm" not in describe(layers).lower()


@pytest.mark.parametrize("model", [
    {"layers": [{"type": "linear", "out": 8}, {"type": "batchnorm"}]},
    {"hidden": [8], "norm": "batchnorm"},
])
def test_batchnorm_is_refused_without_the_fix(model):
    with pytest.raises(ModelSpecError, match="BatchNorm") as info:
        expand_model(model, 3, 1, fix=False)
    assert "fix_model" in str(info.value)  # says how to get past it


def test_opacus_itself_rejects_what_the_fix_replaces():
    # The reason for the fix: Opacus's validator refuses BatchNorm, accepts our module.
    assert ModuleValidator.validate(nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8)), strict=False)
    layers, _ = expand_model({"layers": [{"type": "linear", "out": 8}, {"type": "batchnorm"}]}, 3, 1)
    assert ModuleValidator.validate(build(layers), strict=False) == []


layer = st.one_of(
    st.fixed_dictionaries({"type": st.just("linear"), "out": st.integers(2, 40)}),
    st.sampled_from([{"type": t} for t in ("layernorm", "batchnorm", "groupnorm", "relu", "tanh", "gelu",
                                           "sigmoid", "elu", "leaky_relu", "silu")]),
    st.fixed_dictionaries({"type": st.just("dropout"), "p": st.floats(0.0, 0.9)}),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.lists(layer, max_size=8), n_in=st.integers(2, 30), n_out=st.integers(1, 5))
def test_every_built_module_passes_opacus_validation(layers, n_in, n_out):
    expanded, fixes = expand_model({"layers": layers}, n_in, n_out)
    assert len(fixes) == sum(1 for x in layers if x["type"] == "batchnorm")
    model = build(expanded)
    assert ModuleValidator.validate(model, strict=False) == []
    assert n_parameters(expanded) == sum(p.numel() for p in model.parameters())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert linears[0].in_features == n_in and model[-1] is linears[-1] and linears[-1].out_features == n_out
    for m in model:
        if isinstance(m, nn.GroupNorm):  # default groups leave each at least two channels
            assert m.num_channels % m.num_groups == 0 and m.num_channels // m.num_groups >= 2
            assert m.num_groups <= 32


@pytest.mark.parametrize("model, reason", [
    ({"layers": [{"type": "conv2d"}]}, "unknown layer type 'conv2d'"),
    ({"layers": [{"type": "linear", "out": 0}]}, "out must be an integer in"),
    ({"hidden": [16, 0]}, r"hidden\[1\] must be an integer in"),
    ({"layers": [{"type": "linear", "out": 10}, {"type": "groupnorm", "groups": 4}]}, "must divide the layer width"),
    ({"layers": [{"type": "linear", "out": 10}, {"type": "groupnorm", "groups": 10}]}, "groups must be"),
    ({"hidden": [4096, 4096]}, "parameters; at most"),
    ([64, 32], "must be an object"),
    ("mlp", "must be an object"),
    ({"hidden": [8], "activation": "swish"}, "activation must be one of"),
    ({"hidden": [8], "depth": 3}, "unknown model key"),
    ({"layers": [{"type": "linear", "out": 8}], "hidden": [4]}, "no other model key"),
    ({"layers": [{"type": "dropout", "p": 1.0}]}, "dropout p must be in"),
    ({"layers": [{"type": "linear", "out": 1}, {"type": "layernorm"}]}, "width of at least 2"),
    ({"layers": ["relu"]}, "must be an object with a type"),
])
def test_bad_specs_are_refused_with_a_reason(model, reason):
    with pytest.raises(ModelSpecError, match=reason):
        expand_model(model, 4, 1)


def test_the_parameter_limit_counts_the_output_layer():
    # 10 -> 4096 -> n_out: 11 * 4096 + 4097 n_out parameters; 1209 outputs fit, 1210 do not.
    spec = {"layers": [{"type": "linear", "out": 4096}]}
    layers, _ = expand_model(spec, 10, 1209)
    assert n_parameters(layers) == 11 * 4096 + 4097 * 1209 <= MAX_PARAMETERS
    with pytest.raises(ModelSpecError, match="5,002,426 parameters; at most 5,000,000"):
        expand_model(spec, 10, 1210)


def test_the_default_model_and_its_description():
    layers, fixes = expand_model(None, 6, 3)
    assert fixes == []
    assert describe(layers) == ("Linear(6->128) LayerNorm relu Linear(128->64) LayerNorm relu "
                                "Linear(64->32) LayerNorm relu Linear(32->3)")
