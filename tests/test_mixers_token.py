"""Tests for lesson 00's mixers in mlexp.mixers: CausalConv (left padding, reach) and LSTMMixer (size)."""
import pytest
import torch
import torch.nn.functional as F

from mlexp.mixers import CausalConv, LSTMMixer, SoftmaxAttention, lstm_hidden
from mlexp.train import count_params
from mlexp.transformer import TinyLM


def conv_by_loop(x, weight):
    """Reference: y_t = sum_j W_j x_{t-k+1+j}, zeros before the start. x (B, T, C), weight (C_out, C, k)."""
    B, T, _ = x.shape
    k = weight.shape[-1]
    y = torch.zeros(B, T, weight.shape[0], dtype=x.dtype)
    for t in range(T):
        for j in range(k):
            s = t - (k - 1) + j
            if s >= 0:
                y[:, t] += x[:, s] @ weight[:, :, j].T
    return y


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_causal_conv_matches_the_loop(k):
    torch.manual_seed(0)
    conv = CausalConv(6, kernel_size=k).double()
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    torch.testing.assert_close(conv(x), conv_by_loop(x, conv.conv.weight), rtol=1e-12, atol=1e-12)


def test_causal_conv_never_sees_the_future():
    torch.manual_seed(0)
    conv = CausalConv(8, kernel_size=4)
    x = torch.randn(1, 20, 8)
    x2 = x.clone()
    x2[:, 12:] = torch.randn(1, 8, 8)
    y, y2 = conv(x), conv(x2)
    torch.testing.assert_close(y2[:, :12], y[:, :12])
    assert not torch.allclose(y2[:, 12:], y[:, 12:])
    # ... and it is not a right-padded convolution (which would look ahead)
    right = F.conv1d(F.pad(x.transpose(1, 2), (0, 3)), conv.conv.weight).transpose(1, 2)
    assert not torch.allclose(y, right)


@pytest.mark.parametrize("layers, reach", [(1, 4), (2, 7), (4, 13), (8, 25)])
def test_reach_of_stacked_convs_measured_by_gradients(layers, reach):
    torch.manual_seed(0)
    model = TinyLM(10, 16, layers, lambda i: CausalConv(16, kernel_size=4))
    h = model.embed(torch.randint(10, (1, 40))).detach().requires_grad_(True)
    x = h
    for block in model.blocks:
        x = block(x)
    model.head(model.norm(x))[0, -1].sum().backward()
    seen = (h.grad[0].abs().sum(-1) > 0).nonzero().flatten()
    assert len(seen) == reach == layers * 3 + 1
    assert seen.tolist() == list(range(40 - reach, 40))        # the last `reach` positions


def test_lstm_mixer_matches_attention_parameters_at_dim_64():
    assert lstm_hidden(64) == 35
    assert count_params(LSTMMixer(64)) == 16_380
    assert count_params(SoftmaxAttention(64, n_heads=4)) == count_params(CausalConv(64, 4)) == 16_384
    lm = lambda make: count_params(TinyLM(65, 64, 4, lambda i: make()))
    assert lm(lambda: LSTMMixer(64)) == 204_976
    assert lm(lambda: CausalConv(64, 4)) == lm(lambda: SoftmaxAttention(64, 4)) == 204_992


def test_lstm_mixer_is_causal_and_reaches_the_start():
    torch.manual_seed(0)
    mixer = LSTMMixer(16)
    x = torch.randn(2, 30, 16, requires_grad=True)
    y = mixer(x)
    assert y.shape == x.shape
    y[:, -1].sum().backward()
    assert (x.grad[:, 0].abs().sum() > 0)                      # the first token still matters
    x2 = x.detach().clone()
    x2[:, 20:] += 1
    torch.testing.assert_close(mixer(x2)[:, :20], y[:, :20].detach())


@pytest.mark.parametrize("make", [lambda: CausalConv(8, 3), lambda: LSTMMixer(8)])
def test_wrong_width_is_refused(make):
    with pytest.raises(ValueError, match=r"\(B, T, 8\)"):
        make()(torch.randn(2, 5, 9))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="kernel_size"):
        CausalConv(8, kernel_size=0)
    with pytest.raises(ValueError, match="hidden"):
        LSTMMixer(8, hidden=0)
