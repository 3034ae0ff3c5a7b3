"""Hopfield pooling (models/hopfield_pool.py): ξ = Xᵀ entmax(β X q) over the
final patch tokens, against a float64 reference, average pooling at β = 0, sparse selection,
gradients, TorchScript / fx, every norm and head, and no host reads on the device path."""
import warnings

import pytest
import torch
import torch.fx
import torch.nn as nn

from common.errors import UserError
from configs.schema import HeadConfig, ModelConfig
from models import create_classifier
from models.heads import HEAD_NAMES
from models.hopfield_pool import POOL_MAPPINGS, HopfieldPooling
from models.mappings import threshold_path
from models.resmlp import NORMS, create_resmlp
from sync_guard import no_host_sync

entmax_pkg = pytest.importorskip("entmax")  # the independent reference for the sparse mappings
K_OF = {"ksubset": 4}  # model.pool_k of the mappings that need one (tests/test_ksubset.py tests ksubset itself)
ENTMAX_POOLS = [m for m in POOL_MAPPINGS if m not in K_OF]


@pytest.fixture(autouse=True)
def _quiet_jit():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*deprecated", category=FutureWarning)
        yield


def tokens(B=3, N=16, D=8, seed=0, dtype=torch.float32):
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def reference_pool(x, query, beta, mapping, alpha=1.5):
    """float64 ξ = Xᵀ map(β X q) per head, written per head with the entmax package's mappings."""
    x, query = x.double(), query.double()
    B, N, D = x.shape
    heads, hd = query.shape
    out, weights = [], []
    for h in range(heads):
        xh = x[:, :, h * hd:(h + 1) * hd]
        scores = beta * xh @ query[h]  # (B, N)
        p = {"softmax": lambda s: torch.softmax(s, -1), "sparsemax": lambda s: entmax_pkg.sparsemax(s, -1),
             "entmax15": lambda s: entmax_pkg.entmax15(s, -1),
             "entmax_bisect": lambda s: entmax_pkg.entmax_bisect(s, alpha, -1, n_iter=60)}[mapping](scores)
        weights.append(p)
        out.append(torch.einsum("bn,bnc->bc", p, xh))
    return torch.cat(out, -1), torch.stack(weights, 1)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("mapping", ENTMAX_POOLS)
def test_pooling_against_a_float64_reference(mapping, heads):
    pool = HopfieldPooling(8, heads=heads, mapping=mapping, beta=2.0)
    with torch.no_grad():
        pool.query.normal_(0, 1, generator=torch.Generator().manual_seed(1))
    x = tokens()
    want, want_w = reference_pool(x, pool.query.detach(), 2.0, mapping)
    with torch.no_grad():
        torch.testing.assert_close(pool(x).double(), want, atol=1e-5, rtol=1e-5)
        w = pool.weights(x)
    assert w.shape == (3, heads, 16)
    torch.testing.assert_close(w.double(), want_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, heads), atol=1e-6, rtol=0)
    if mapping != "softmax":  # a sharp query: some patches are not used at all
        assert (w == 0).any() and torch.equal(w == 0, want_w == 0)


@pytest.mark.parametrize("mapping", ENTMAX_POOLS)
def test_float64_tokens_are_pooled_in_float64(mapping):
    """float64 in, float64 out, computed in float64: the weights and the pooled feature agree with the
    float64 reference far below float32's resolution (a float32 softmax would be ~1e-8 off)."""
    pool = HopfieldPooling(8, heads=2, mapping=mapping, beta=2.0).double()
    with torch.no_grad():
        pool.query.normal_(0, 1, generator=torch.Generator().manual_seed(1))
        x = tokens(dtype=torch.float64)
        out, w = pool(x), pool.weights(x)
    assert out.dtype == w.dtype == torch.float64
    want, want_w = reference_pool(x, pool.query, 2.0, mapping)
    torch.testing.assert_close(w, want_w, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)


def test_beta_zero_with_softmax_is_average_pooling():
    x = tokens()
    for beta in (0.0, 1e-9):
        pool = HopfieldPooling(8, heads=2, mapping="softmax", beta=beta)
        torch.testing.assert_close(pool(x), x.mean(1), atol=1e-6, rtol=1e-6)
    # the whole model: a hopfield model at beta = 0 gives the average-pooling model's logits
    hop = create_resmlp("resmlp_tiny", num_classes=5, global_pool="hopfield", pool_beta=0.0).eval()
    avg = create_resmlp("resmlp_tiny", num_classes=5).eval()
    missing = avg.load_state_dict({k: v for k, v in hop.state_dict().items() if not k.startswith("pool.")}).missing_keys
    assert missing == []
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(hop(x), avg(x), atol=1e-6, rtol=1e-6)
        assert not torch.allclose(create_resmlp("resmlp_tiny", num_classes=5, global_pool="hopfield",
                                                pool_beta=50.0).eval().pool(hop.forward_features(x)),
                                  hop.forward_features(x).mean(1))


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15", "entmax_bisect"])
def test_a_dominant_patch_is_selected_alone(mapping):
    pool = HopfieldPooling(8, mapping=mapping, beta=1.0)
    with torch.no_grad():
        pool.query.copy_(torch.ones(1, 8))
    x = 0.1 * tokens()
    x[:, 5] = 3.0  # patch 5 agrees with the query far more than any other
    with torch.no_grad():
        w = pool.weights(x)
        pooled = pool(x)
    expected = torch.zeros(3, 1, 16)
    expected[:, :, 5] = 1.0
    assert torch.equal(w, expected)
    torch.testing.assert_close(pooled, x[:, 5])
    soft = HopfieldPooling(8, mapping="softmax", beta=1.0)
    with torch.no_grad():
        soft.query.copy_(torch.ones(1, 8))
        assert (soft.weights(x) > 0).all()  # softmax uses every patch


@pytest.mark.parametrize("mapping", POOL_MAPPINGS)
def test_gradients_reach_the_query_and_every_parameter(mapping):
    model = create_resmlp("resmlp_tiny", num_classes=4, global_pool="hopfield", pool_mapping=mapping,
                          pool_k=K_OF.get(mapping)).train()
    with torch.no_grad():
        model.pool.query.mul_(100)  # sharp enough that the sparse mappings are sparse
    nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    assert model.pool.query.grad is not None and model.pool.query.grad.abs().sum() > 0
    if mapping == "entmax_bisect":
        assert model.pool.alpha_logit.grad is not None and model.pool.alpha_logit.grad != 0
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("mapping", POOL_MAPPINGS)
def test_script_and_fx_match_eager(mapping, norm):
    model = create_resmlp("resmlp_tiny", num_classes=6, norm=norm, depth=2, embed_dim=16,
                          global_pool="hopfield", pool_mapping=mapping, pool_k=K_OF.get(mapping)).eval()
    with torch.no_grad():
        model.pool.query.normal_(0, 2, generator=torch.Generator().manual_seed(2))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), want, atol=0, rtol=0)


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_every_head_trains_and_evaluates_with_hopfield_pooling(head):
    cfg = ModelConfig(pool="hopfield", pool_mapping="entmax15")
    model = create_classifier(cfg, HeadConfig(name=head), 10, img_size=32)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 7, 9])
    loss = model.output_head.loss(model.train()(x), y)
    loss.backward()
    assert torch.isfinite(loss) and model.pool.query.grad is not None
    with torch.no_grad():
        p = model.output_head(model.eval()(x))
        w = model.pooling_weights(x)
    torch.testing.assert_close(p.sum(-1), torch.ones(4), atol=1e-5, rtol=0)
    assert w.shape == (4, 1, 64)


def test_pooling_weights_report_the_support():
    model = create_resmlp("resmlp_tiny", num_classes=3, global_pool="hopfield", pool_mapping="sparsemax").eval()
    with torch.no_grad():
        model.pool.query.normal_(0, 5, generator=torch.Generator().manual_seed(4))
        x = torch.randn(2, 3, 32, 32)
        w = model.pooling_weights(x)
        support = (w > 0).sum(-1)
        torch.testing.assert_close(model.pool(model.forward_features(x)),
                                   torch.einsum("bn,bnd->bd", w[:, 0], model.forward_features(x)))
    assert ((1 <= support) & (support < 64)).all()  # sparse: some patches, not all
    avg = create_resmlp("resmlp_tiny", num_classes=3).eval()
    with torch.no_grad():
        torch.testing.assert_close(avg.pooling_weights(x), torch.full((2, 1, 64), 1 / 64))


@pytest.mark.parametrize("mapping", POOL_MAPPINGS)
def test_no_host_reads_on_the_device_path(mapping):
    pool = HopfieldPooling(16, heads=2, mapping=mapping, k=K_OF.get(mapping))
    x = tokens(B=4, N=64, D=16).requires_grad_()
    with threshold_path("device"), no_host_sync(block_host_data=True) as guard:
        out = pool(x)
        grads = torch.autograd.grad(out.mul(torch.linspace(-1, 1, 16)).sum(), [x] + list(pool.parameters()))
    assert not guard.violations and not guard.allowed
    assert all(torch.isfinite(g).all() for g in grads)


def test_config_keys_and_their_errors():
    from configs.loader import config_from_dict

    cfg = config_from_dict({"model": {"pool": "hopfield", "pool_mapping": "sparsemax", "pool_beta": 0.5}})
    model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)
    assert model.pool.mapping == "sparsemax" and model.pool.beta == 0.5
    default = create_classifier(config_from_dict({}).model, cfg.head, 10, img_size=cfg.data.image_size)
    assert isinstance(default.pool, nn.Identity) and default.global_pool == "avg"  # average pooling stays the default
    assert not any(k.startswith("pool.") for k in default.state_dict())  # and its weights are unchanged
    for bad, match in (({"pool": "max"}, "model.pool"), ({"pool": "hopfield", "pool_mapping": "relu"}, "pool_mapping"),
                       ({"pool": "hopfield", "pool_beta": -1.0}, "pool_beta")):
        with pytest.raises(UserError, match=match) as e:
            config_from_dict({"model": bad})
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="model.pool is 'avg'"):  # a hopfield setting is not silently ignored
        config_from_dict({"model": {"pool_mapping": "sparsemax"}})
    with pytest.raises(UserError, match="divide the 128 channels"):
        HopfieldPooling(128, heads=3)
