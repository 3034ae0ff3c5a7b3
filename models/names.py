"""The model section's vocabularies, declared once and importable without torch (the config
schema's choices read them before torch loads): the named ResMLP variants, the norms and the
poolings. models/resmlp.py builds and registers what is named here."""

# The one table of variants: MODEL_NAMES, the pretrained configs and the constructors of
# models/resmlp.py all follow it (tests/test_model.py checks that every name here is registered with
# timm, and nothing else).
VARIANTS = {
    "resmlp_tiny": dict(img_size=32, patch_size=4, embed_dim=128, depth=4),
    "resmlp_cifar_s12": dict(img_size=32, patch_size=4, embed_dim=384, depth=12),
    "resmlp_cifar_s24": dict(img_size=32, patch_size=4, embed_dim=384, depth=24),
    "resmlp_s12": dict(img_size=224, patch_size=16, embed_dim=384, depth=12),
    "resmlp_s24": dict(img_size=224, patch_size=16, embed_dim=384, depth=24),
    "resmlp_s36": dict(img_size=224, patch_size=16, embed_dim=384, depth=36),
    # DeiT's resmlpB_24 (and timm's resmlp_big_24) start LayerScale at 1e-6, below the depth rule.
    "resmlp_b24": dict(img_size=224, patch_size=8, embed_dim=768, depth=24, init_values=1e-6),
}
MODEL_NAMES = tuple(VARIANTS)
NORMS = ("affine", "layernorm", "batchnorm")
POOLS = ("avg", "hopfield")  # mean over patches (the paper's), or sparse Hopfield retrieval (hopfield_pool.py)
