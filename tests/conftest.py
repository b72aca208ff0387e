import pytest
import torch

from sitelens.models import tiny_model

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session", params=["mha", "gqa"])
def tiny(request):
    """A tiny random HookedTransformer: multi-head (4 q heads) and grouped-query (2 kv heads)."""
    kv = None if request.param == "mha" else 2
    return tiny_model(n_layers=2, n_heads=4, d_head=8, n_key_value_heads=kv, seed=0)


@pytest.fixture(scope="session")
def tiny_mha():
    return tiny_model(n_layers=2, n_heads=4, d_head=8, seed=0)


@pytest.fixture(scope="session")
def smollm2():
    from sitelens.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma():
    from sitelens.models import load_model

    return load_model("gemma-3-270m")
