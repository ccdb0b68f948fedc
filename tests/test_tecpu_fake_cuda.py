"""The emulated torch.cuda's RNG calls act on the one emulated device's generator (the CPU's): a seed set through
manual_seed or manual_seed_all gives the draws torch.manual_seed gives; what it does not emulate raises naming it."""
import pytest
import torch

from te_verify.te.tecpu.cuda import make_cuda


@pytest.mark.parametrize("seed_call", ["manual_seed", "manual_seed_all"])
def test_seeding_the_emulated_device_seeds_the_generator_its_tensors_draw_from(seed_call):
    cuda = make_cuda()
    with torch.random.fork_rng(devices=[]):  # the process's generator as it was, after the test
        getattr(cuda, seed_call)(1202)
        drawn = torch.randn(8)
        torch.manual_seed(1202)
        assert torch.equal(drawn, torch.randn(8))
        cuda.manual_seed(7)
        assert not torch.equal(torch.randn(8), drawn)


def test_an_unemulated_cuda_call_raises_naming_it():
    with pytest.raises(Exception, match="graph_pool_handle"):
        make_cuda().graph_pool_handle()


def test_device_context_selects_the_one_emulated_device():
    """torch.cuda.device(d) (TE's router validates QB bin bounds under it): the emulated device as TE's tensors name it
    (the CPU), as "cuda" / "cuda:0" or 0 is index 0; None is a no-op (-1), as in torch; another device is refused."""
    cuda = make_cuda()
    for name in (torch.device("cpu"), "cuda", "cuda:0", torch.device("cuda", 0), 0):
        with cuda.device(name) as selected:
            assert selected.idx == 0
    assert cuda.device(None).idx == -1
    for other in (1, "cuda:1"):
        with pytest.raises(Exception, match=r"torch\.cuda\.device"):
            cuda.device(other)
